"""Evaluation on a data split: during training (rank 0) and for ``hrmctl eval CHECKPOINT``.

Sudoku: ``cell_acc`` (blank cells right), ``exact_accuracy`` (whole grids right). The recurrent
models run ``halt_max_steps`` segments from a fresh state; they also report what their own
Q-head halting gives (``exact_accuracy_qhalt``, ``halt_steps``: mean segments at which it halts)
and the exact accuracy after each number of segments (``exact_by_segments``).

``hrmctl eval CHECKPOINT [--data DIR] [--split val] [--batches N] [--segments N] [--json]`` (its options:
cli/tools/evaluate.py) calls :func:`evaluate_checkpoint`.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from auralm import tasks
from auralm.errors import UserError
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


def evaluate_checkpoint(checkpoint: Path, data: Path | None, split: str, batches: int | None, batch_size: int,
                        segments: int | None) -> dict:
    """What ``hrmctl eval`` reports (its options: cli/tools/evaluate.py): the checkpoint, the data and split, the
    examples seen and the split's metrics (:func:`evaluate`), on the CPU. Bad input is one UserError."""
    import contextlib

    from auralm.data import datadir
    from auralm.tools.inference import load

    loaded = load(Path(checkpoint))
    data_dir = Path(data) if data else loaded.data_dir
    meta = datadir.load_manifest(data_dir, loaded.task)
    if split not in meta["splits"]:
        raise UserError(f"--split {split}: {data_dir} has the splits {', '.join(meta['splits'])}")
    val = tasks.open_split(data_dir, meta, split, loaded.arch["block_size"])
    if len(val) == 0:
        raise UserError(f"the {split} split of {data_dir} is empty")
    out = evaluate(loaded.model, val, loaded.task, batch_size, batches, torch.device("cpu"), contextlib.nullcontext(),
                   segments)
    return {"checkpoint": str(loaded.path), "data": str(data_dir), "split": split,
            "examples": min(len(val), (batches or len(val)) * batch_size), **out}
