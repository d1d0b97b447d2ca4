"""What one micro-step computes, per model kind, and the training metrics summed over ranks.

``Plain``: the model maps a batch to its loss (GPT, the sudoku transformer). ``Recurrent``: an ACT
model (HRM, TRM) runs one segment on its carry, one carry per micro-step of gradient accumulation;
halted rows take their fresh example from the batch the step was given. The recurrent models learn the task's
targets for every position (auralm.tasks: sudoku's givens are copied), so "exact" means the whole grid.
"""

from __future__ import annotations

import torch

from auralm import tasks
from auralm.training import distributed
from auralm.models import Carry


class Plain:
    def __init__(self, raw: torch.nn.Module, cfg):
        self.raw = raw

    def loss(self, model, x, y, micro: int):
        _, loss = model(x, y)
        return loss, {}

    def summarize(self, sums: dict, by_rank: dict, per_step: int) -> dict:
        return {}  # no metrics of its own beside the loss

    def reset(self) -> None:
        pass

    def state_dict(self):
        return None

    def load_state_dict(self, state) -> None:
        pass


class Recurrent:
    def __init__(self, raw: torch.nn.Module, cfg):
        self.raw, self.task = raw, tasks.get(cfg.task)
        self.carries: list[Carry | None] = [None] * cfg.training.grad_accum

    def loss(self, model, x, y, micro: int):
        y = self.task.targets(x, y)  # sudoku: the givens too
        if micro >= len(self.carries):  # more micro-steps than the run began with (DiLoCo: a rank takes over the
            self.carries += [None] * (micro + 1 - len(self.carries))  # rows of ranks that left): fresh carries
        carry = self.carries[micro] or self.raw.initial_carry(x, y)
        carry, logits, q, target = model(carry, x, y)
        self.carries[micro] = carry
        return self.raw.loss(carry, logits, q, target)

    def summarize(self, sums: dict, by_rank: dict, per_step: int) -> dict:
        """The log line's metrics from the summed ones: the model's own summary of what its loss measured."""
        return self.raw.summarize(sums, by_rank, per_step)

    def reset(self) -> None:
        """Every row takes a fresh example and state at the next step (after a skipped or restored step,
        whose states may hold non-finite values or come from other weights)."""
        self.carries = [None] * len(self.carries)

    def state_dict(self):
        return [None if c is None else {k: (tuple(t.cpu() for t in v) if isinstance(v, tuple) else v.cpu())
                                        for k, v in c.state_dict().items()} for c in self.carries]

    def load_state_dict(self, state) -> None:
        if state is not None and len(state) == len(self.carries):
            device = next(self.raw.parameters()).device
            self.carries = [None if c is None else Carry.from_state_dict(c, device) for c in state]


def make(raw: torch.nn.Module, cfg):
    return (Recurrent if getattr(raw, "recurrent", False) else Plain)(raw, cfg)


class Meter:
    """Sums the micro-steps' metric tensors between two log lines; ``read`` gathers them from every rank (one
    all-reduce, at log steps only, which every rank reaches together) and the step kind turns the sums into the
    log line's figures (``summarize``: an ACT model's rates per halted row)."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.n = 0

    def add(self, metrics: dict) -> None:
        for k, v in metrics.items():
            self.sums[k] = self.sums.get(k, 0) + v.detach().float()
        self.n += bool(metrics)

    def read(self, d: distributed.Dist, summarize) -> dict:
        """``summarize(sums, by_rank, per_step)`` of what every rank summed since the last read; {} when none."""
        if not self.sums:
            return {}
        keys = sorted(self.sums)
        table = torch.zeros(d.world, len(keys), device=d.device)  # each rank fills its own row: an all-gather
        table[d.rank] = torch.stack([self.sums[k] for k in keys]).to(d.device)
        table = distributed.all_reduce_(d, table)
        sums = dict(zip(keys, table.sum(dim=0).tolist()))
        by_rank = dict(zip(keys, table.t().tolist()))
        per_step = self.n * d.world
        self.sums, self.n = {}, 0
        return summarize(sums, by_rank, per_step)
