"""``training.parallel=fsdp``: the model sharded over the ranks (auralm.parallel.fsdp), its gradients
reduce-scattered every step; every rank evaluates and writes its shards (DCP checkpoints, also alone).

A world of one keeps the model whole but its checkpoints sharded, so a run can move between one rank and
several. Imports torch, auralm.parallel's single, fsdp and strategy, and the loop parts (checkpoint, models,
distributed, precision).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from auralm import models
from auralm.training import checkpoint, distributed
from auralm.parallel import fsdp as fsdp_lib
from auralm.parallel.single import Single
from auralm.training.precision import bf16_compute
from auralm.models.args import ModelArgs


class Sharded(Single):
    name = "fsdp"
    option = "parallel"
    several_ranks = True
    sharded_checkpoints = True
    shards_states = True  # over the ranks, for the memory preflight (cli/launch/plan/memory.py)
    waits = "every DDP step waits for the slowest"  # as the link budget says it of DDP: every step is collective

    def __init__(self, cfg, d):
        super().__init__(cfg, d)
        self.sharded = d.world > 1  # a world of one keeps the model whole
        self.grad_copies = 1 if d.world > 1 else 0
        self.sharding = ""

    def attach(self, training, ckpt, loop_step) -> None:
        if self.sharded:  # the parameters the step clips and checks are the shards: a forward without gradients
            fsdp_lib.reshard(training.model)  # (the run's time probe, an evaluation) leaves the root unit gathered
        super().attach(training, ckpt, loop_step)

    def run_dir(self, out_dir: Path | None) -> Path | None:
        return shared_run_dir(self.d, out_dir) if self.sharded else out_dir

    def shard(self, model: torch.nn.Module) -> str:
        if self.sharded:
            self.sharding = fsdp_lib.shard(model, bf16_compute(self.t, self.d.device), self.t.fsdp_cpu_offload,
                                           self.d.device)
        return self.sharding

    def say_start(self, log, step: int) -> None:
        if not self.sharded:
            return
        raw = self.p.model
        sizes = distributed.gather_object(self.d, sum(fsdp_lib.local(q).numel() for q in raw.parameters()))
        log.event(step, "fsdp", f"{self.sharding}; parameters held per rank: "
                  f"{', '.join(f'{n / 1e6:.3f}M' for n in sizes)} of "
                  f"{sum(q.numel() for q in raw.parameters()) / 1e6:.3f}M", local_params=sizes,
                  params=sum(q.numel() for q in raw.parameters()))

    @property
    def loss_scale(self) -> float:
        return self.p.shares.loss_scale(self.d.rank) if self.sharded else 1.0

    def micro_batch(self, last: bool):
        if self.sharded:  # the gradients are reduce-scattered after the last micro-batch only
            self.p.model.set_requires_gradient_sync(last)
        return super().micro_batch(last)

    def shard_norm(self, params: list):
        if not self.sharded:
            return None
        return torch.nn.utils.get_total_norm([fsdp_lib.local(q.grad) for q in params if q.grad is not None])

    def global_norm(self, norm: torch.Tensor) -> torch.Tensor:
        return fsdp_lib.full(norm)  # a DTensor: the same on every rank

    def guard_norm(self, norm: torch.Tensor, own) -> torch.Tensor:
        return own if self.sharded else norm

    def save(self, run_dir: Path, step: int, rng: list, state: dict | None, extra: dict | None) -> Path | None:
        """Every rank writes its shards (a world of one: the whole model, as DCP)."""
        return checkpoint.save_sharded(run_dir, step, self.p.model, self.p.optimizer, self.d.rank, rng, state,
                                       self.t.keep_last, extra)

    def final_model(self, model: torch.nn.Module, whole: bool, arch: ModelArgs, vocab) -> torch.nn.Module:
        return whole_model(model, self.cfg, arch, vocab) if self.sharded and whole else model

    @classmethod
    def link_cost(cls, budget: dict, hook: str) -> dict | None:
        return budget["ddp"]  # the gradients' bytes every step (reduce-scattered, the weights all-gathered)


def whole_model(raw: torch.nn.Module, cfg, arch: ModelArgs, vocab) -> torch.nn.Module:
    """A whole (unsharded) copy of the model on the CPU, all-gathered from the shards one tensor at a time (every
    rank calls it): what ``auralm.training.train.run`` returns when asked for the model. Built under a forked RNG, so
    training's random state is left as it was."""
    sd = {k: fsdp_lib.full(v).detach().cpu() for k, v in raw.state_dict().items()}
    with torch.random.fork_rng(devices=[]):
        model = models.build(cfg.task, arch, vocab)
    model.load_state_dict(sd)
    return model.train(raw.training)


def shared_run_dir(d: distributed.Dist, out_dir: Path | None) -> Path:
    """fsdp: the run directory, where every rank writes its shards of the checkpoints: rank 0's, which every rank
    must see (one file system shared by the nodes), else a UserError on every rank."""
    path = Path(distributed.broadcast_object(d, str(out_dir.absolute()) if d.rank == 0 else None))
    token, error = None, None
    if d.rank == 0:
        try:
            path.mkdir(parents=True, exist_ok=True)
            token = f".shared-check-{os.getpid()}-{time.time_ns()}"
            (path / token).write_text("")
        except OSError as e:
            error = f"cannot write the run directory {path}: {e.strerror or e}"
    distributed.raise_if_any(d, error)
    token = distributed.broadcast_object(d, token)
    if not (path / token).exists():
        error = (f"training.parallel=fsdp: every rank writes its shards of the checkpoints into the run directory "
                 f"{path}, which this node does not see as rank 0's: put out_dir on a file system every node "
                 f"shares (NFS), or use training.parallel=ddp")
    elif d.rank != 0:
        try:  # the other ranks may run as other users: they must be able to write there too
            (path / f"{token}-{d.rank}").touch()
            (path / f"{token}-{d.rank}").unlink()
        except OSError as e:
            error = (f"training.parallel=fsdp: cannot write this rank's shards into the run directory {path} "
                     f"({e.strerror}): make it writable by every node's user (the same user on every node, "
                     f"or a group they share: chmod g+ws), or use training.parallel=ddp")
    try:
        distributed.raise_if_any(d, error)
    finally:
        if d.rank == 0:
            (path / token).unlink(missing_ok=True)
    return path
