"""The NaN guard: a non-finite loss or gradient on any rank skips that step on every rank; repeats restore.

Each step every rank puts its own finite flags and its loss into one small vector and the ranks
all-reduce it: one collective, after which every rank knows which ranks went bad and skips the
update together (the mean loss for the log comes with it). When ``max_bad`` bad steps fall within
``window`` steps, rank 0 restores the last good state it keeps in memory (taken at the start and
every ``snapshot_every`` good steps), broadcasts parameters and optimizer state to every rank,
the learning rate is lowered for a while, and a checksum of the parameters gathered from every
rank confirms they are identical again.

Under DiLoCo (auralm.parallel.diloco) there is no collective per step: each rank checks its own
step (``finite``) and skips it alone; the counts are agreed at the end of the round, where the same
window and recovery apply (``after_round``).

Under ``training.parallel=fsdp`` (``sharded``) no rank holds the whole state: every rank keeps a snapshot
of its own shards (parameters and optimizer state) and a recovery restores them on every rank in place,
with no broadcast: the shards of one step are consistent, so that is the same state rank 0's broadcast
would give. The checksum after it is over the whole (all-gathered) parameters.

A run that cannot learn stops (``NanStop``, a UserError: one line, exit 2, raised on every rank in the same step,
since every rank holds the same agreed counts): when ``STOP_AFTER`` steps in a row were skipped, or when the last
step is reached and not one update was applied in this run (every step skipped by the guard, or by fp16's
GradScaler). The line names the likely cause and the override that fixes it (``stop_line``).
"""

from __future__ import annotations

import copy

import torch

from auralm.training.config import Config, GuardConfig, resolved_model
from auralm.training.distributed import Dist, all_reduce_, broadcast_state, compare_checksums
from auralm.errors import UserError
from auralm.training.runlog import RunLog

STOP_AFTER = 20  # this many steps in a row skipped on every rank stop the run (recoveries did not help)


class NanStop(UserError):
    """Training cannot go on: every step of a window was skipped. The message is the one line to show."""


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (fsdp), else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _local_copy(obj):
    """A copy of this rank's own part of ``obj`` (tensors, DTensors' local shards, in dicts and lists)."""
    if isinstance(obj, torch.Tensor):
        return local(obj).detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _local_copy(v) for k, v in obj.items()}
    return copy.deepcopy(obj)


def _cpu_copy(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


class NanGuard:
    def __init__(self, cfg: GuardConfig, d: Dist, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 log: RunLog, sharded: bool = False, run: Config | None = None, precision: str = "fp32"):
        """``run``: the run's config (its max_steps, lr, fault injection: for the stop's line); ``precision``: the
        arithmetic of the forward and backward (bf16, fp16 or fp32)."""
        self.cfg, self.d, self.model, self.optimizer, self.log = cfg, d, model, optimizer, log
        self.sharded, self.run, self.precision = sharded, run, precision
        self.bad_steps: list[int] = []
        self.lr_low_until = 0  # steps up to this one run at lr * lr_factor
        self.snapshot: dict | None = None
        self.snapshot_step = 0
        self.begun = self.last_applied = 0  # the step this run started at; the last step whose update was applied
        self.updates = 0  # updates applied in this run (not skipped by the guard, nor by fp16's GradScaler)
        self.streak: dict = {"what": set(), "ranks": set()}  # what went non-finite, where, since last_applied

    def begin(self, step: int) -> None:
        """At the start of the run (or of a resumed one), at ``step``: the first snapshot."""
        self.begun = self.last_applied = step
        self.take_snapshot(step)

    def lr_scale(self, step: int) -> float:
        return self.cfg.lr_factor if step <= self.lr_low_until else 1.0

    def take_snapshot(self, step: int) -> None:
        self.snapshot_step = step
        if self.sharded:
            self.snapshot = {"step": step, "model": _local_copy(self.model.state_dict()),
                             "optimizer": [{k: _local_copy(v) for k, v in self.optimizer.state.get(p, {}).items()}
                                           for p in self._params()]}
        elif self.d.rank == 0:
            self.snapshot = {"step": step, "model": _cpu_copy(self.model.state_dict()),
                             "optimizer": _cpu_copy(self.optimizer.state_dict())}

    def check(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[bool, float]:
        """On every rank: (whether every rank's loss and gradients are finite, the mean loss over ranks)."""
        v = torch.zeros(self.d.world + 1, device=loss.device)
        v[self.d.rank] = (~torch.isfinite(loss)).float() + 2 * (~torch.isfinite(grad_norm)).float()
        v[-1] = loss.float()
        flags = all_reduce_(self.d, v).tolist()
        bad = [r for r in range(self.d.world) if flags[r]]
        if not bad:
            self._applied(step)
            return True, flags[-1] / self.d.world
        self.bad_steps = [s for s in self.bad_steps if s > step - self.cfg.window] + [step]
        parts = [w for w, bit in (("loss", 1), ("gradients", 2)) if any(int(flags[r]) & bit for r in bad)]
        self._skipped(parts, bad)
        what = " and ".join(parts)
        self.log.event(step, "nan_skip", f"nan guard: step {step}: non-finite {what} on rank {', '.join(map(str, bad))};"
                       f" update skipped on all {self.d.world} ranks ({len(self.bad_steps)} of {self.cfg.max_bad}"
                       f" within {self.cfg.window} steps before recovery)", rank=bad)
        return False, float("nan")

    def _applied(self, step: int) -> None:
        self.last_applied = step
        self.streak = {"what": set(), "ranks": set()}

    def _skipped(self, parts: list[str], ranks: list[int]) -> None:
        self.streak["what"].update(parts)
        self.streak["ranks"].update(ranks)

    def after_step(self, step: int, ok: bool, scaler_skipped: bool = False) -> bool:
        """After a step (or a DiLoCo round) ending at ``step``: the stop when the run cannot learn (NanStop, on
        every rank); a snapshot when one is due; a recovery when ``max_bad`` bad steps fell within ``window``
        (then True). ``scaler_skipped``: fp16's GradScaler skipped this step's update (not the guard's doing)."""
        self.updates += self.last_applied == step and not scaler_skipped
        self.stop_if_stuck(step)
        if ok and step - self.snapshot_step >= self.cfg.snapshot_every:
            self.take_snapshot(step)
        if len(self.bad_steps) >= self.cfg.max_bad:
            self.recover(step)
            return True
        return False

    def stop_if_stuck(self, step: int) -> None:
        """NanStop on every rank (their counts are the same) when the last STOP_AFTER steps were all skipped, or
        when this is the last step and not one update was applied in this run: never a quiet "finished"."""
        skipped = step - self.last_applied
        if skipped >= STOP_AFTER:
            raise NanStop(self.stop_line(step, skipped))
        last = self.run is not None and step >= self.run.training.max_steps
        if last and step > self.begun and not self.updates:
            raise NanStop(self.stop_line(step, skipped) if skipped else
                          f"training.dtype=fp16: its GradScaler skipped the update of every one of the "
                          f"{step - self.begun} steps of this run (the scaled gradients overflowed at every scale "
                          f"it tried), so nothing was learned; rerun with training.dtype=bf16 (or fp32)")

    def stop_line(self, step: int, skipped: int) -> str:
        """The stop's one line: which steps, what went non-finite where, the likely cause, the override."""
        first = step - skipped + 1
        steps = f"step {step}" if skipped == 1 else f"all {skipped} steps {first}-{step}"
        what = " and ".join(sorted(self.streak["what"])) or "values"
        ranks = ", ".join(map(str, sorted(self.streak["ranks"])))
        none = ", and no update was applied in this run" if self.last_applied == self.begun else ""
        cause, fix = self.likely_cause(first, step)
        return (f"nan guard: stopping: {steps} skipped on every rank (non-finite {what} on rank {ranks}){none}: "
                f"{cause}; rerun {fix}")

    def likely_cause(self, first: int, last: int) -> tuple[str, str]:
        """(the likely cause of steps first..last all going non-finite, the override that fixes it)."""
        run = self.run
        if run is None:
            return "cause unknown (the guard was given no run configuration)", "with training.dtype=fp32"
        fault, t = run.fault, run.training
        if fault.nan_rank in self.streak["ranks"] and any(s in fault.nan_at_step for s in range(first, last + 1)):
            return (f"fault.nan_at_step puts NaN into rank {fault.nan_rank}'s gradients at these steps (fault "
                    f"injection, asked for on the command line)", "without fault.nan_at_step")
        if self.last_applied > self.begun:
            return (f"training diverged after step {self.last_applied} at training.lr={t.lr:g} (the guard's restores "
                    f"and lowered lr did not help)", f"with training.lr={t.lr / 10:g}")
        start = "its initial weights" if not self.begun else f"the checkpoint of step {self.begun}"
        if self.precision in ("bf16", "fp16"):
            chosen = f"training.dtype=auto chose {self.precision} on this device" if t.dtype == "auto" else \
                f"training.dtype={t.dtype}"
            return (f"non-finite from the first step, from {start}, in {self.precision} arithmetic ({chosen})",
                    "with training.dtype=fp32")
        cause = (f"the model gives non-finite values on this data from {start} in fp32, before any update (so "
                 f"neither the learning rate nor the precision)")
        if getattr(resolved_model(run.model), "loss_type", "") == "stablemax":
            return cause, "with model.loss_type=softmax"
        if self.begun:
            return cause, "from an earlier checkpoint of this run (resume=<its checkpoint-<step> directory>)"
        return cause, "with the data prepared again (hrmctl prepare-data), or a smaller model (model=tiny)"

    @staticmethod
    def finite(loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """DiLoCo: whether this rank's step may be taken (no collective; the counts are agreed per round)."""
        return bool(torch.isfinite(loss) & torch.isfinite(grad_norm))

    def after_round(self, step: int, bad_steps: list[int], broken: list[int], learned: bool = True) -> None:
        """DiLoCo, on every rank alike: the local steps each rank skipped in the round that ended at ``step``,
        and the ranks whose change of the weights was not finite (the round was then discarded everywhere);
        ``learned``: some rank applied some local step and the round was kept."""
        count = sum(bad_steps) + len(broken)
        if learned and not broken:
            self._applied(step)
        else:
            self._skipped(["loss or gradients"] if not broken else ["change of the weights"],
                          [r for r, n in enumerate(bad_steps) if n] + broken)
        if not count:
            return
        self.bad_steps = [s for s in self.bad_steps if s > step - self.cfg.window] + [step] * count
        skipped = [f"rank {r} skipped {n} local step{'s' * (n > 1)}" for r, n in enumerate(bad_steps) if n]
        what = "; ".join(skipped + ([f"the change of the weights was not finite on rank "
                                     f"{', '.join(map(str, broken))}: round discarded on all {self.d.world} ranks"]
                                    if broken else []))
        self.log.event(step, "nan_skip", f"nan guard: round ending at step {step}: non-finite loss or gradients: "
                       f"{what} ({len(self.bad_steps)} of {self.cfg.max_bad} within {self.cfg.window} steps before "
                       f"recovery)", rank=[r for r, n in enumerate(bad_steps) if n] + broken)

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    @torch.no_grad()
    def _restore_shards(self) -> None:
        """fsdp: every rank puts back its own shards of the parameters and the optimizer state, in place."""
        for name, t in self.model.state_dict().items():
            local(t).copy_(self.snapshot["model"][name])
        for p, saved in zip(self._params(), self.snapshot["optimizer"]):
            if not saved:  # no state yet at the snapshot (before the first step): the optimizer starts it again
                self.optimizer.state.pop(p, None)
                continue
            state = self.optimizer.state[p]
            for k, v in saved.items():
                if isinstance(state.get(k), torch.Tensor):
                    local(state[k]).copy_(v)
                else:
                    state[k] = copy.deepcopy(v)

    def recover(self, step: int) -> None:
        if self.sharded:
            self._restore_shards()
        elif self.d.rank == 0:
            self.model.load_state_dict(self.snapshot["model"])
            self.optimizer.load_state_dict(copy.deepcopy(self.snapshot["optimizer"]))
        restored = self.snapshot["step"] if self.snapshot else None
        if not self.sharded:
            broadcast_state(self.d, self.model, self.optimizer)
        self.lr_low_until = step + self.cfg.lr_steps
        self.bad_steps = []
        phrase, sums, equal = compare_checksums(self.d, self.model)
        how = (f"every one of the {self.d.world} ranks restored its own shards of the state of step {restored}"
               if self.sharded else
               f"restored the state of step {restored} on rank 0 and broadcast it to all {self.d.world} ranks")
        self.log.event(step, "recovery", f"nan guard: step {step}: {self.cfg.max_bad} bad steps within"
                       f" {self.cfg.window}: {how}; lr x{self.cfg.lr_factor} until step {self.lr_low_until}; {phrase}",
                       rank=0, restored_step=restored, lr_low_until=self.lr_low_until, checksums=sums, equal=equal)
        if not equal:
            raise RuntimeError(f"ranks hold different parameters after the NaN recovery at step {step}: {sums}")

    def state_dict(self) -> dict:
        return {"lr_low_until": self.lr_low_until}

    def load_state_dict(self, state: dict) -> None:
        self.lr_low_until = state.get("lr_low_until", 0)
