"""The single-process strategy: what a mode says when it changes nothing. The step itself is the loop's
(auralm.training.step): a mode declares the rows each rank takes, how the gradients become common, the norms the step
and the guard see, what a skipped step resets, how it writes a checkpoint, and when the ranks meet (``advance``: here
every step).

The other strategies are subclasses that change what differs: DDP (auralm.parallel.ddp) wraps the model and
weighs the loss by the rank's share; FSDP (fsdp_strategy) shards it; DiLoCo (diloco_strategy) takes rounds of
the loop's steps. The interface is auralm.parallel.strategy.Strategy. Imports torch and auralm's loop parts
(checkpoint, data, distributed), never auralm.training.train.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from auralm import tasks
from auralm.data import datadir
from auralm.models.args import ModelArgs
from auralm.parallel.strategy import Strategy, Training
from auralm.training import checkpoint, distributed


class Single(Strategy):
    """One process trains alone (``training.sync=ddp`` in a world of one); what every other mode keeps unless it
    says otherwise."""

    name = "single"
    several_ranks = False
    sharded = False  # the model's weights are split over the ranks (every rank evaluates, saves its part)
    sharded_checkpoints = False  # checkpoints are DCP shards
    grad_copies = 0  # gradient copies held besides the model's (DDP's buckets), for batch_size=auto
    per_step_ema = True  # the EMA follows every optimizer step (DiLoCo: every round)

    def __init__(self, cfg, d: distributed.Dist):
        self.cfg, self.d, self.t = cfg, d, cfg.training
        self.augment = self.t.augment and tasks.get(cfg.task).augment  # the batches' (sudoku's permutations)

    # ------------------------------------------------------------ before the loop

    def run_dir(self, out_dir: Path | None) -> Path | None:
        return out_dir

    def shard(self, model: torch.nn.Module) -> str:
        return ""

    def inner_steps(self) -> int | None:
        return None

    def attach(self, training: Training, ckpt, loop_step) -> None:
        self.p, self.loop_step = training, loop_step
        self.model = training.model  # as trained: wrap() may put a wrapper around it

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

    # ------------------------------------------------------------ what the loop's step asks (auralm.training.step)

    @property
    def loss_scale(self) -> float:
        return 1.0

    def micro_batch(self, last: bool):
        """The context of one micro-batch's forward and backward (DDP: no all-reduce but after the last)."""
        return contextlib.nullcontext()

    def global_norm(self, norm: torch.Tensor) -> torch.Tensor:
        """The gradient norm as every rank sees it (FSDP: gathered from the shards)."""
        return norm

    def shard_norm(self, params: list):
        """FSDP: the norm of this rank's own gradient shards (a NaN there is this rank's); else None."""
        return None

    def guard_norm(self, norm: torch.Tensor, own) -> torch.Tensor:
        """The norm the NaN guard checks (FSDP: ``own``, this rank's shards')."""
        return norm

    def bad_step(self) -> None:
        """What else a skipped step resets (DDP's PowerSGD: its error feedback)."""

    def advance(self, loop_step) -> tuple[int, float, torch.Tensor]:
        """The ranks meet every step: one step of the loop's (``loop_step``, auralm.training.step.TrainStep)."""
        return loop_step()

    def finish_pending(self, loss: float) -> float:
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
