"""The training step, the loop's own: one rank's forward and backward over its micro-batches (fp16's loss scaling),
the clipping, the NaN guard's verdict and the update. It is the same in every sync mode; what a mode changes it
declares (auralm.parallel.strategy.Strategy), and the step asks:

- the rows each rank takes (``batches``);
- how the gradients become common (``micro_batch``: DDP's no_sync and FSDP's reduce-scatter after the last
  micro-batch only), a rank's weight in their average (``loss_scale``: its share of the global batch);
- the gradient norm every rank sees (``global_norm``: FSDP's over the shards), the one the guard checks
  (``guard_norm``: FSDP's of this rank's own shards, so that a NaN is this rank's) and what a skipped step resets
  besides the carries (``bad_step``: DDP's PowerSGD error feedback);
- the model as trained (``model``: DDP's wrapper), and whether the EMA follows every step (``per_step_ema``);
- when the ranks meet (``advance``: once a step, :meth:`TrainStep.__call__`; DiLoCo's rounds of these local steps).

Fault injection is not in the step: a test's ``fault.*`` keys install hooks (auralm.training.faults), which the step
calls at its two points. Imports torch and the loop's parts (optim, precision), no strategy by name.
"""

from __future__ import annotations

import torch

from auralm.training import optim
from auralm.training.precision import autocast


class TrainStep:
    """One rank's training step for the trainer ``p`` (auralm.parallel.strategy.Training) in the mode ``s``."""

    def __init__(self, cfg, d, p, s):
        self.t, self.d, self.p, self.s = cfg.training, d, p, s
        # fp16 (training.dtype=fp16): float16 gradients underflow, so the loss is multiplied by the scaler's scale
        # before backward and the gradients divided by it (unscale_) before the clipping. When the scaled gradients
        # overflowed (inf or NaN) the scaler skips the update and halves the scale: that is the scaler's normal
        # work, not a failure, so local() hands the NaN guard a norm of 0 for such a step (``overflowed``) and
        # apply() lets scaler.step decide; a non-finite loss, or fault.nan_at_step, still goes to the guard. The scale
        # is saved in checkpoints (the part "grad_scaler", rank 0's: under DDP every rank's is the same, as the
        # gradients are). With any other dtype the scaler is disabled and changes nothing.
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.t.dtype == "fp16")
        self.overflowed = False
        self.own_norm = None  # fsdp: the norm of this rank's own gradient shards, for the guard's per-rank flag
        self.params: list = []
        self.samples_factor = 1.0  # every rank's rows per row of this one: the samples a step counts
        self.sources = 1  # the ranks whose rows this rank takes each step: itself (DiLoCo: and ranks that left)
        self.stream = None  # this rank's batches

    def register(self, ckpt) -> None:
        """fp16: the loss scale, kept in checkpoints and restored on a resume."""
        if self.scaler.is_enabled():
            ckpt.register("grad_scaler", self.scaler)

    def start(self) -> None:
        """As the loop begins (the mode attached, the model as trained made): the parameters it updates (the
        shards under FSDP), this rank's part of the samples, its batches."""
        self.params = [q for q in self.p.model.parameters() if q.requires_grad]
        self.samples_factor = self.p.shares.global_factor(self.d.rank)
        self.stream = self.s.batches()

    def lr(self, at: int) -> float:
        guard = self.p.guard
        return optim.lr_at(self.t, at) * (guard.lr_scale(at) if guard else 1.0)

    def local(self, at: int):
        """Forward and backward over the micro-batches, clipping: (loss, grad norm) of this rank."""
        p, t, d, s = self.p, self.t, self.d, self.s
        for hook in p.hooks:
            hook.before_step(at)
        optim.set_lr(p.optimizer, self.lr(at))
        loss_sum = torch.zeros((), device=d.device)
        for micro in range(t.grad_accum):
            x, y = next(self.stream)
            x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
            with s.micro_batch(micro == t.grad_accum - 1):
                with autocast(t, d.device):
                    loss, metrics = p.objective.loss(s.model, x, y, micro)
                self.scaler.scale(loss * (s.loss_scale / t.grad_accum)).backward()
            loss_sum += loss.detach()
            p.meter.add(metrics)
            p.done += p.train_set.units(x) * self.samples_factor
        p.position += t.grad_accum // self.sources  # the position in each rank's batches, as if all were present
        self.scaler.unscale_(p.optimizer)  # fp16: the true gradients, for the check below and the clipping
        nan_fault = any([hook.after_backward(at, self.params) for hook in p.hooks])
        self.own_norm = s.shard_norm(self.params)
        if t.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, t.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([q.grad for q in self.params if q.grad is not None])
        norm = s.global_norm(norm)
        self.overflowed = self.scaler.is_enabled() and not nan_fault and bool(torch.isfinite(loss_sum)) and \
            not bool(torch.isfinite(norm))
        if self.overflowed:  # fp16: the scaler skips this step in apply; nothing is applied, the guard sees 0
            norm = torch.zeros_like(norm)
        return loss_sum / t.grad_accum, norm

    def apply(self, ok: bool) -> None:
        """The update (``ok``), or a skipped step: every row's carry starts afresh, and what the mode resets."""
        p = self.p
        if ok:
            self.scaler.step(p.optimizer)  # optimizer.step(), unless fp16's scaled gradients overflowed
            if p.ema and self.s.per_step_ema and not self.overflowed:
                p.ema.update()
        else:  # the carries came from a bad step: every row starts afresh
            p.objective.reset()
            self.s.bad_step()
        self.scaler.update()  # fp16: half the scale after an overflow, double it after 2000 steps without one
        p.optimizer.zero_grad(set_to_none=True)

    def __call__(self) -> tuple[int, float, torch.Tensor]:
        """One step of every rank together (the gradients averaged under DDP and FSDP), the guard agreed by one
        all-reduce: (the step, the loss, the grad norm)."""
        p = self.p
        at = p.step + 1
        loss, norm = self.local(at)
        guard = p.guard
        ok, mean = guard.check(at, loss * self.s.loss_scale, self.s.guard_norm(norm, self.own_norm)) if guard \
            else (True, float(loss))
        self.apply(ok)
        if guard:
            guard.after_step(at, ok, scaler_skipped=self.overflowed)  # may stop the run (NanStop) on every rank
        return at, mean, norm
