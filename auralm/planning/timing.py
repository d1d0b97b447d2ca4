"""A run's time before it starts, for ``hrmctl train --dry-run``: estimate(args, world) is one JSON document, the
launcher's plan process's "time" (auralm.planning.server).

The trainer's model is built here as the trainer builds it and timed with the trainer's own probes
(auralm.training.budget: measure_rate's forward and backward passes, time_eval_batch's evaluation forward) on random
rows of the data's shape (the task's random_batch, as test-ddp times its compute), at most the rows of about
PROBE_FLOPS a pass (a large model is timed on fewer rows than its batch and scaled up: the dry run stays short, the
figure errs slow). The rows of the data come from its manifest when it is here (else the embedded default's sizes).
Then the trainer's own plan (budget.plan) says the lines a run says before its first step, and what
training.time_budget would set max_steps to, from this machine's figures; each run times its own nodes at start.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch

from auralm import models, tasks
from auralm.planning import link_budget, sizing
from auralm.training import budget, command_line, config, objective

PROBE_FLOPS = 2e10  # a probe pass's work at most (about 0.2 s at 100 GFLOP/s): the rows timed are capped by it


class Rows:
    """Rows of the data's shape for the probes (what they read of a split: its length and ``batch``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def batch(self, index):
        index = list(index)
        return self.x[index], self.y[index]


def data_rows(cfg: config.Config) -> tuple[int, int, int | None] | None:
    """(train rows, val rows, vocabulary) of the run's data when its manifest is here, the embedded default's sizes
    when it is not made yet, else None."""
    from auralm.data import datadir

    data_dir = Path(cfg.data_dir or f"data/{cfg.task}").expanduser()
    if (data_dir / "meta.json").exists():
        meta = datadir.load_manifest(data_dir, cfg.task)
        block = config.resolved_model(cfg.model).block_size
        n = [len(tasks.open_split(data_dir, meta, split, block)) for split in ("train", "val")]
        return n[0], n[1], tasks.get(cfg.task).vocab(meta)
    made = tasks.get(cfg.task).default_rows()  # the data a run with no data_dir makes itself (sudoku's default)
    if made and not cfg.data_dir:
        return made[0], made[1], None
    return None


def probe(cfg: config.Config, vocab: int | None, device: torch.device) -> tuple[float, float, int]:
    """(this machine's rows/s in training, seconds of an evaluation batch of training.batch_size, rows timed)."""
    t = cfg.training
    arch = config.resolved_model(cfg.model)
    model = link_budget.run_model(cfg, 1)
    per_row = 6 * model["parameters"] * model["tokens_per_sample"] * model["passes"]
    rows = max(1, min(t.batch_size, int(PROBE_FLOPS // max(1, per_row))))
    torch.manual_seed(t.seed)
    raw = models.build(cfg.task, arch, vocab).to(device)
    x, y = tasks.get(cfg.task).random_batch(arch, vocab, rows, device)
    rate = budget.measure_rate(objective.make(raw, cfg), raw, Rows(x, y), t, device)
    return rate, budget.time_eval_batch(raw, x, y, t, device) * t.batch_size / rows, rows


def estimate(args: list[str], world: int = 1) -> dict:
    """The dry run's document: the probe's figures and the lines the run would say before its first step."""
    cfg, _ = command_line.parse_command_line(args)
    t = cfg.training
    sizing.per_rank(cfg, world)
    counts = data_rows(cfg)
    if t.batch_size == config.AUTO:
        return {"lines": [], "why": "training.batch_size=auto: the batch is chosen at start, and the time with it"}
    if counts is None:
        return {"lines": [], "why": f"no data in {cfg.data_dir or 'data/' + cfg.task} here to size the run by"}
    n_train, n_val, vocab = counts
    vocab = vocab or sizing.given_vocab(cfg) or tasks.get(cfg.task).default_vocab
    config.resolve_epochs(t, world, n_train)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rate, eval_s, rows = probe(cfg, vocab, device)
    each, final = budget.eval_batches(cfg.task, n_val, t)
    timing = budget.Timing(step_s=t.batch_size * t.grad_accum / rate + cfg.fault.step_sleep, eval_batch_s=eval_s,
                           each_batches=each, final_batches=final, ranks=world)
    given = t.max_steps
    lines = budget.plan(cfg, timing, 0, fresh=True)
    return {"lines": [line for _, line in lines], "kinds": [k for k, _ in lines], "max_steps": t.max_steps,
            "given_max_steps": given, "step_s": timing.step_s, "eval_batch_s": eval_s, "rows_timed": rows,
            "batch_size": t.batch_size, "host": socket.gethostname(), "device": device.type,
            "total_s": timing.total_s(t, 0, t.max_steps)}
