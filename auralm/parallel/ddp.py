"""``training.sync=ddp`` with several ranks: DistributedDataParallel, every step's gradients all-reduced
(compressed with ``training.ddp_comm_hook``, auralm.parallel.comm_hooks), each rank's loss weighed by its share.

A world of one takes the single-process strategy instead (``alone``). Imports torch, auralm.parallel's
single, comm_hooks and strategy, and the loop parts single.py imports.
"""

from __future__ import annotations

import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP

from auralm.training import objective as objectives
from auralm.parallel import comm_hooks
from auralm.parallel.single import Single
from auralm.training.precision import autocast, rng_state, set_rng_state



class DataParallel(Single):
    name = "ddp"
    alone = "auralm.parallel.single:Single"
    several_ranks = True
    grad_copies = 1
    waits = "every DDP step waits for the slowest"

    def __init__(self, cfg, d):
        super().__init__(cfg, d)
        self.hook = None

    def say_start(self, log, step: int) -> None:
        if self.t.ddp_comm_hook != "none":
            log.say(f"sync: ddp, gradients compressed with the {self.t.ddp_comm_hook} hook")

    def wrap(self, ckpt) -> None:
        """DDP around the model, its comm hook, and the hook's state (PowerSGD's, each rank's own) registered with the
        checkpoints: restored on a resume."""
        d, t, raw = self.d, self.t, self.p.model
        # gradient_as_bucket_view: the gradients are views into DDP's all-reduce buckets, which saves copying every
        # gradient into its bucket and back each step (and that memory). Buffers go from rank 0 with the weights at
        # the start, not again before each forward: forward_sync_buffers=False (torch 2.13, every node's: hrmctl setup
        # installs this machine's version; its deprecated broadcast_buffers=False printed a FutureWarning on every rank)
        self.model = DDP(raw, device_ids=[d.device.index] if d.device.type == "cuda" else None,
                         process_group=d.group, gradient_as_bucket_view=True, forward_sync_buffers=False)
        self.hook = comm_hooks.register(self.model, t.ddp_comm_hook, d, rank=t.powersgd_rank,
                                        start_iter=t.warmup_steps, seed=t.seed)
        if self.hook is not None:
            ckpt.register("powersgd", get=lambda: comm_hooks.state_dict(self.hook), put=self.load_hook_state,
                          per_rank=True)

    def load_hook_state(self, saved) -> None:
        if saved:
            self.prime_buckets()
            self.p.optimizer.zero_grad(set_to_none=True)
            comm_hooks.load_state_dict(self.hook, saved)

    def prime_buckets(self) -> None:
        """One forward and backward through DDP that changes nothing (the loss times zero, no optimizer step; the
        random state and the ACT carries put back), so that DDP lays its gradient buckets out as after a run's
        first step: what PowerSGD's saved state is kept in (auralm/parallel/comm_hooks.py). The caller zeroes the
        grads."""
        d, objective = self.d, self.p.objective
        rng = rng_state(d.device)
        carry = objective.state_dict() if isinstance(objective, objectives.Recurrent) else None
        x, y = next(self.batches())
        with autocast(self.t, d.device):
            loss, _ = objective.loss(self.model, x.to(d.device), y.to(d.device), 0)
        (loss * 0).backward()
        if carry is not None:
            objective.load_state_dict(carry)
        set_rng_state(rng, d.device)

    @property
    def loss_scale(self) -> float:
        return self.p.shares.loss_scale(self.d.rank)

    def micro_batch(self, last: bool):
        return contextlib.nullcontext() if last else self.model.no_sync()

    def bad_step(self) -> None:
        comm_hooks.reset(self.hook)

    @classmethod
    def link_cost(cls, budget: dict, hook: str) -> dict | None:
        """The budget's entry for this comm hook: what a DDP step sends."""
        return {"bf16": budget["ddp_bf16"], "fp16": budget["ddp_bf16"],
                "powersgd": budget["ddp_powersgd"]}.get(hook, budget["ddp"])
