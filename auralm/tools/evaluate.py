"""Evaluation on a data split: during training (rank 0) and for ``hrmctl eval CHECKPOINT``.

Sudoku: ``cell_acc`` (blank cells right), ``exact_accuracy`` (whole grids right). The recurrent
models run ``halt_max_steps`` segments from a fresh state; they also report what their own
Q-head halting gives (``exact_accuracy_qhalt``, ``halt_steps``: mean segments at which it halts)
and the exact accuracy after each number of segments (``exact_by_segments``).

Each accuracy comes with its 95% interval (``ci95``): Wilson's score interval for the share of whole grids right
(the samples are independent), and for the per-position accuracy the ratio estimator's interval with the samples
as clusters (a grid's cells are not independent of each other: a model that misses one often misses several).
A split or a puzzle file of any size is evaluated batch by batch.

``hrmctl eval CHECKPOINT [--data DIR] [--split val] [--puzzles FILE] [--batches N] [--segments N] [--json]``
(its options: cli/tools/evaluate.py) calls :func:`evaluate_checkpoint`.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from auralm import tasks
from auralm.errors import UserError
from auralm.models.layers import IGNORE, per_token_loss


Z95 = 1.959964  # the standard normal's 97.5th percentile


def wilson(k: int, n: int) -> list[float]:
    """The 95% score interval of a share of ``k`` in ``n`` independent trials."""
    if n == 0:
        return [0.0, 1.0]
    p, z2 = k / n, Z95 * Z95
    centre, half = (p + z2 / (2 * n)) / (1 + z2 / n), Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def ratio_interval(right: torch.Tensor, total: torch.Tensor) -> list[float]:
    """The 95% interval of sum(right) / sum(total) over samples that each hold ``total`` scored positions, of which
    ``right`` are right (the samples as clusters: the ratio estimator's variance)."""
    right, total = right.double(), total.double()
    n, m = len(total), float(total.sum())
    if n < 2 or m == 0:
        return [0.0, 1.0]
    r = float(right.sum()) / m
    se = math.sqrt(float(((right - r * total) ** 2).sum()) / (n * (n - 1))) * n / m
    return [round(max(0.0, r - Z95 * se), 4), round(min(1.0, r + Z95 * se), 4)]


def _batches(val, batch_size: int, max_batches: int | None, progress=None):
    n = math.ceil(len(val) / batch_size)
    n = n if max_batches is None else min(max_batches, n)
    for b in range(n):
        yield val.batch(range(b * batch_size, min(len(val), (b + 1) * batch_size)))
        if progress:
            progress(min(len(val), (b + 1) * batch_size), min(len(val), n * batch_size))


@torch.no_grad()
def _plain(model, val, task: tasks.Task, batch_size: int, max_batches, device, autocast, segments=None,
           progress=None) -> dict:
    losses, rights, totals = [], [], []
    for x, y in _batches(val, batch_size, max_batches, progress):
        x, y = x.to(device), y.to(device)
        with autocast:
            logits, loss = model(x, y)
        losses.append(loss.item())
        if task.solved_whole:
            blank = y != IGNORE
            right = (logits.argmax(-1) == y) & blank
            rights.append(right.sum(dim=1).cpu())
            totals.append(blank.sum(dim=1).cpu())
    out = {"val_loss": sum(losses) / len(losses)}
    if task.solved_whole:
        right, total = torch.cat(rights), torch.cat(totals)
        n, solved = len(total), int((right == total).sum())
        out.update({task.accuracy: int(right.sum()) / max(1, int(total.sum())), "exact_accuracy": solved / max(1, n),
                    "ci95": {"exact_accuracy": wilson(solved, n), task.accuracy: ratio_interval(right, total)}})
    return out


@torch.no_grad()
def _recurrent(model, val, task: tasks.Task, batch_size: int, max_batches, device, autocast, segments=None,
               progress=None) -> dict:
    loss_sum, tokens, exact_q, halt_sum, rights, totals = 0.0, 0, 0, 0, [], []
    by_segment = None
    for x, y in _batches(val, batch_size, max_batches, progress):
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
        rights.append((right[-1] & scored).sum(dim=1).cpu())
        totals.append(scored.sum(dim=1).cpu())
    right, total = torch.cat(rights), torch.cat(totals)
    n = len(total)
    out = {"val_loss": loss_sum / max(1, tokens), task.accuracy: int(right.sum()) / max(1, int(total.sum()))}
    ci = {task.accuracy: ratio_interval(right, total)}
    if task.solved_whole:
        solved = int(by_segment[-1])
        out.update(exact_accuracy=solved / max(1, n), exact_accuracy_qhalt=exact_q / max(1, n),
                   halt_steps=halt_sum / max(1, n), exact_by_segments=[round(int(c) / max(1, n), 4) for c in by_segment])
        ci.update(exact_accuracy=wilson(solved, n), exact_accuracy_qhalt=wilson(exact_q, n))
    out["ci95"] = ci
    return out


def evaluate(model, val, task: str, batch_size: int, max_batches: int | None, device: torch.device,
             autocast, segments: int | None = None, progress=None) -> dict:
    """The split's metrics over its first ``max_batches`` batches (None: all of it); a recurrent model runs
    ``segments`` segments (None: its halt_max_steps). ``progress(done, total)``: called after each batch."""
    was = model.training
    model.eval()
    try:
        run = _recurrent if getattr(model, "recurrent", False) else _plain
        return run(model, val, tasks.get(task), batch_size, max_batches, device, autocast, segments, progress)
    finally:
        model.train(was)


def evaluate_checkpoint(checkpoint: Path, data: Path | None, split: str, batches: int | None, batch_size: int,
                        segments: int | None, puzzles: str | None = None, progress=None) -> dict:
    """What ``hrmctl eval`` reports (its options: cli/tools/evaluate.py): the checkpoint, the data and split (or the
    puzzle file), the examples seen and their metrics (:func:`evaluate`), on the CPU. Bad input is one UserError."""
    import contextlib

    from auralm.data import datadir
    from auralm.tools.inference import load

    if puzzles and data:
        raise UserError("--puzzles FILE and --data DIR each say what to evaluate on: give one")
    loaded = load(Path(checkpoint))
    task = tasks.get(loaded.task)
    if puzzles:
        val = task.open_file(puzzles)
        where = {"puzzles": str(puzzles)}
    else:
        data_dir = Path(data) if data else loaded.data_dir
        meta = datadir.load_manifest(data_dir, loaded.task)
        if split not in meta["splits"]:
            raise UserError(f"--split {split}: {data_dir} has the splits {', '.join(meta['splits'])}")
        val = tasks.open_split(data_dir, meta, split, loaded.arch.block_size)
        if len(val) == 0:
            raise UserError(f"the {split} split of {data_dir} is empty")
        where = {"data": str(data_dir), "split": split}
    out = evaluate(loaded.model, val, loaded.task, batch_size, batches, torch.device("cpu"), contextlib.nullcontext(),
                   segments, progress)
    return {"checkpoint": str(loaded.path), **where, "examples": min(len(val), (batches or len(val)) * batch_size),
            **out}
