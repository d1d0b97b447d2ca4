"""Evaluation on a data split: during training (rank 0) and for ``hrmctl eval CHECKPOINT``.

Sudoku: ``cell_acc`` (blank cells right), ``exact_accuracy`` (whole grids right). The recurrent
models run ``halt_max_steps`` segments from a fresh state; they also report what their own
Q-head halting gives (``exact_accuracy_qhalt``, ``halt_steps``: mean segments at which it halts)
and the exact accuracy after each number of segments (``exact_by_segments``).

``python -m auralm.tools.evaluate CHECKPOINT [--data DIR] [--split val] [--batches N] [--segments N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from auralm import tasks
from auralm.errors import UserError, exit_frozen
from auralm.models.layers import IGNORE, per_token_loss


def _batches(val, batch_size: int, max_batches: int | None):
    n = math.ceil(len(val) / batch_size)
    for b in range(n if max_batches is None else min(max_batches, n)):
        yield val.batch(range(b * batch_size, min(len(val), (b + 1) * batch_size)))


@torch.no_grad()
def _plain(model, val, task: tasks.Task, batch_size: int, max_batches, device, autocast, segments=None) -> dict:
    losses, cells, cells_right, solved, n = [], 0, 0, 0, 0
    for x, y in _batches(val, batch_size, max_batches):
        x, y = x.to(device), y.to(device)
        with autocast:
            logits, loss = model(x, y)
        losses.append(loss.item())
        if task.solved_whole:
            blank = y != IGNORE
            right = (logits.argmax(-1) == y) & blank
            cells += int(blank.sum())
            cells_right += int(right.sum())
            solved += int((right | ~blank).all(dim=1).sum())
            n += x.shape[0]
    out = {"val_loss": sum(losses) / len(losses)}
    if task.solved_whole:
        out.update({task.accuracy: cells_right / max(1, cells), "exact_accuracy": solved / max(1, n)})
    return out


@torch.no_grad()
def _recurrent(model, val, task: tasks.Task, batch_size: int, max_batches, device, autocast, segments=None) -> dict:
    loss_sum, tokens, cells, cells_right, n, exact_q, halt_sum = 0.0, 0, 0, 0, 0, 0, 0
    by_segment = None
    for x, y in _batches(val, batch_size, max_batches):
        x, y = x.to(device), y.to(device)
        target = task.targets(x, y)
        with autocast:
            preds, qs, logits = model.solve(x, segments)
        mask = target != IGNORE
        loss_sum += float(per_token_loss(logits, target, model.loss_type).sum())
        tokens += int(mask.sum())
        right = (preds == target) | ~mask  # (S, B, T)
        ok = right.all(dim=-1)  # (S, B)
        by_segment = ok.sum(dim=1) if by_segment is None else by_segment + ok.sum(dim=1)
        halt = model.halt_index(qs)
        exact_q += int(ok[halt, torch.arange(x.shape[0], device=device)].sum())
        halt_sum += int((halt + 1).sum())
        scored = y != IGNORE  # sudoku: the blanks; lm: every target
        cells += int(scored.sum())
        cells_right += int((right[-1] & scored).sum())
        n += x.shape[0]
    out = {"val_loss": loss_sum / max(1, tokens)}
    out[task.accuracy] = cells_right / max(1, cells)
    if task.solved_whole:
        out.update(exact_accuracy=int(by_segment[-1]) / max(1, n), exact_accuracy_qhalt=exact_q / max(1, n),
                   halt_steps=halt_sum / max(1, n), exact_by_segments=[round(int(c) / max(1, n), 4) for c in by_segment])
    return out


def evaluate(model, val, task: str, batch_size: int, max_batches: int | None, device: torch.device,
             autocast, segments: int | None = None) -> dict:
    """The split's metrics over its first ``max_batches`` batches (None: all of it); a recurrent model runs
    ``segments`` segments (None: its halt_max_steps)."""
    was = model.training
    model.eval()
    try:
        run = _recurrent if getattr(model, "recurrent", False) else _plain
        return run(model, val, tasks.get(task), batch_size, max_batches, device, autocast, segments)
    finally:
        model.train(was)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(message)


def main(argv: list[str] | None = None) -> int:
    import contextlib

    from auralm.data import datadir
    from auralm.tools.inference import load

    p = _Parser(prog=os.environ.get("AURALM_PROG", "python -m auralm.tools.evaluate"),
                description="Evaluate a checkpoint on a data split.")
    p.add_argument("checkpoint", help="a checkpoint-<step> directory, or a run directory (its best checkpoint)")
    p.add_argument("--data", help="the data directory (default: the one the run trained on)")
    p.add_argument("--split", default="val", help="the split to evaluate (default: val, the held-out puzzles)")
    p.add_argument("--batches", type=int, default=None, help="evaluate only this many batches")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--segments", type=int, default=None,
                   help="HRM/TRM: segments to run (default: the model's halt_max_steps; more may solve more)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    try:
        a = p.parse_args(argv)
        if a.batch_size <= 0 or any(v is not None and v <= 0 for v in (a.batches, a.segments)):
            raise UserError("--batch-size, --batches and --segments must be greater than 0")
        loaded = load(Path(a.checkpoint))
        data_dir = Path(a.data) if a.data else loaded.data_dir
        meta = datadir.load_manifest(data_dir, loaded.task)
        if a.split not in meta["splits"]:
            raise UserError(f"--split {a.split}: {data_dir} has the splits {', '.join(meta['splits'])}")
        val = tasks.open_split(data_dir, meta, a.split, loaded.arch["block_size"])
        if len(val) == 0:
            raise UserError(f"the {a.split} split of {data_dir} is empty")
        out = evaluate(loaded.model, val, loaded.task, a.batch_size, a.batches, torch.device("cpu"),
                       contextlib.nullcontext(), a.segments)
        out = {"checkpoint": str(loaded.path), "data": str(data_dir), "split": a.split,
               "examples": min(len(val), (a.batches or len(val)) * a.batch_size), **out}
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:22} {v:.4f}" if isinstance(v, float) else f"{k:22} {v}")
    return 0


if __name__ == "__main__":
    exit_frozen(main())
