"""The single-process strategy: one rank's training step (forward and backward over the micro-batches, fp16's
loss scaling, clipping, the NaN guard's verdict, the optimizer step), and how it writes a checkpoint.

The other strategies are subclasses that change what differs: DDP (auralm.parallel.ddp) wraps the model and
weighs the loss by the rank's share; FSDP (fsdp_strategy) shards it; DiLoCo (diloco_strategy) takes rounds of
these steps. The interface is auralm.parallel.strategy.Strategy. Imports torch and auralm's loop parts
(checkpoint, optim, precision, data, distributed), never auralm.training.train.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from auralm import tasks
from auralm.data import datadir
from auralm.training import checkpoint, distributed, optim
from auralm.parallel.strategy import Strategy, Training
from auralm.training.precision import autocast
from auralm.models.args import ModelArgs


class Single(Strategy):
    """One process trains alone (``training.sync=ddp`` in a world of one)."""

    name = "single"
    several_ranks = False
    sharded = False  # the model's weights are split over the ranks (every rank evaluates, saves its part)
    sharded_checkpoints = False  # checkpoints are DCP shards
    grad_copies = 0  # gradient copies held besides the model's (DDP's buckets), for batch_size=auto
    per_step_ema = True  # the EMA follows every optimizer step (DiLoCo: every round)

    def __init__(self, cfg, d: distributed.Dist):
        self.cfg, self.d, self.t = cfg, d, cfg.training
        self.augment = self.t.augment and tasks.get(cfg.task).augment  # the batches' (sudoku's permutations)
        # fp16 (training.dtype=fp16): float16 gradients underflow, so the loss is multiplied by the scaler's scale
        # before backward and the gradients divided by it (unscale_) before the clipping. When the scaled gradients
        # overflowed (inf or NaN) the scaler skips the update and halves the scale: that is the scaler's normal
        # work, not a failure, so local_step hands the NaN guard a norm of 0 for such a step (``overflowed``) and
        # apply lets scaler.step decide; a non-finite loss, or fault.nan_at_step, still goes to the guard. The scale
        # is saved in checkpoints (the part "grad_scaler", rank 0's: under DDP every rank's is the same, as the
        # gradients are), registered as the strategy attaches. With any other dtype the scaler is disabled and changes
        # nothing.
        self.scaler = torch.amp.GradScaler(d.device.type, enabled=self.t.dtype == "fp16")
        self.overflowed = False
        self.own_norm = None  # fsdp: the norm of this rank's own gradient shards, for the guard's per-rank flag

    # ------------------------------------------------------------ before the loop

    def run_dir(self, out_dir: Path | None) -> Path | None:
        return out_dir

    def shard(self, model: torch.nn.Module) -> str:
        return ""

    def inner_steps(self) -> int | None:
        return None

    def attach(self, training: Training, ckpt) -> None:
        self.p = training
        self.model = training.model
        self.params = [q for q in training.model.parameters() if q.requires_grad]
        self.samples_factor = training.shares.global_factor(self.d.rank)
        self.sources = 1  # the ranks whose rows this rank takes each step: itself (DiLoCo: and ranks that left)
        if self.scaler.is_enabled():
            ckpt.register("grad_scaler", self.scaler)

    def say_start(self, log, step: int) -> None:
        pass

    def wrap(self, ckpt) -> None:
        pass

    def batches(self, rank: int | None = None):
        """This rank's batches (or another ``rank``'s) from its position on: its share of each global batch."""
        t, d, p = self.t, self.d, self.p
        rank = d.rank if rank is None else rank
        if p.shares.equal:
            return datadir.batches(p.train_set, p.shares.batch[rank], rank, d.world, t.seed, start=p.position,
                                augment=self.augment)
        return datadir.shared_batches(p.train_set, p.shares.batch, rank, t.seed, start=p.position,
                                      augment=self.augment)

    def start(self) -> None:
        """The batches, as the loop begins."""
        self.stream = self.batches()

    @property
    def loss_scale(self) -> float:
        return 1.0

    # ------------------------------------------------------------ one step

    def lr(self, at: int) -> float:
        guard = self.p.guard
        return optim.lr_at(self.t, at) * (guard.lr_scale(at) if guard else 1.0)

    def micro_batch(self, last: bool):
        """The context of one micro-batch's forward and backward (DDP: no all-reduce but after the last)."""
        return contextlib.nullcontext()

    def whole(self, norm: torch.Tensor) -> torch.Tensor:
        """The gradient norm as every rank sees it (FSDP: gathered from the shards)."""
        return norm

    def local_step(self, at: int):
        """Forward and backward over the micro-batches, clipping: (loss, grad norm) of this rank."""
        p, t, d = self.p, self.t, self.d
        for hook in p.hooks:
            hook.before_step(at)
        optim.set_lr(p.optimizer, self.lr(at))
        loss_sum = torch.zeros((), device=d.device)
        for micro in range(t.grad_accum):
            x, y = next(self.stream)
            x, y = x.to(d.device, non_blocking=True), y.to(d.device, non_blocking=True)
            with self.micro_batch(micro == t.grad_accum - 1):
                with autocast(t, d.device):
                    loss, metrics = p.step_kind.loss(self.model, x, y, micro)
                self.scaler.scale(loss * (self.loss_scale / t.grad_accum)).backward()
            loss_sum += loss.detach()
            p.meter.add(metrics)
            p.done += p.train_set.units(x) * self.samples_factor
        p.position += t.grad_accum // self.sources  # the position in each rank's batches, as if all were present
        self.scaler.unscale_(p.optimizer)  # fp16: the true gradients, for the check below and the clipping
        nan_fault = any([hook.after_backward(at, self.params) for hook in p.hooks])
        self.own_norm = self.shard_norm()
        if t.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, t.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([q.grad for q in self.params if q.grad is not None])
        norm = self.whole(norm)
        self.overflowed = self.scaler.is_enabled() and not nan_fault and bool(torch.isfinite(loss_sum)) and \
            not bool(torch.isfinite(norm))
        if self.overflowed:  # fp16: the scaler skips this step in apply; nothing is applied, the guard sees 0
            norm = torch.zeros_like(norm)
        return loss_sum / t.grad_accum, norm

    def shard_norm(self):
        """FSDP: the norm of this rank's own gradient shards (a NaN there is this rank's); else None."""
        return None

    def apply(self, ok: bool) -> None:
        p = self.p
        if ok:
            self.scaler.step(p.optimizer)  # optimizer.step(), unless fp16's scaled gradients overflowed
            if p.ema and self.per_step_ema and not self.overflowed:
                p.ema.update()
        else:  # the carries came from a bad step: every row starts afresh
            p.step_kind.reset()
            self.bad_step()
        self.scaler.update()  # fp16: half the scale after an overflow, double it after 2000 steps without one
        p.optimizer.zero_grad(set_to_none=True)

    def bad_step(self) -> None:
        """What else a skipped step resets (DDP's PowerSGD: its error feedback)."""

    def step(self) -> tuple[int, float, torch.Tensor]:
        """One step of every rank together: the gradients averaged (DDP, FSDP), the guard agreed by one all-reduce."""
        p = self.p
        at = p.step + 1
        loss, norm = self.local_step(at)
        guard = p.guard
        ok, mean = guard.check(at, loss * self.loss_scale, self.guard_norm(norm)) if guard else (True, float(loss))
        self.apply(ok)
        if guard:
            guard.after_step(at, ok, scaler_skipped=self.overflowed)  # may stop the run (NanStop) on every rank
        return at, mean, norm

    def guard_norm(self, norm: torch.Tensor) -> torch.Tensor:
        return norm

    def settle(self, loss: float) -> float:
        """Before an evaluation or a checkpoint: nothing in flight here; the loss as it was."""
        return loss

    def meter_group(self) -> distributed.Dist:
        return self.d

    # ------------------------------------------------------------ checkpoints and the end

    def wire_figures(self) -> dict:
        """This rank's traffic for the step's record (``round_bytes``: what it sent for its last round), where the
        strategy counts it."""
        return {}

    def save(self, run_dir: Path, step: int, rng: list, state: dict | None, extra: dict | None) -> Path | None:
        """Write the checkpoint the manager assembled (auralm.training.checkpoint_manager): rank 0 the whole model;
        the path on rank 0."""
        if self.d.rank == 0:
            return checkpoint.save(run_dir, step, self.p.model, self.p.optimizer, rng, state, self.t.keep_last, extra)
        return None

    def final_model(self, model: torch.nn.Module, whole: bool, arch: ModelArgs, vocab) -> torch.nn.Module:
        """The trained model the trainer returns (FSDP: a whole copy when ``whole``)."""
        return model

    @classmethod
    def link_cost(cls, budget: dict, hook: str) -> dict | None:
        return None
