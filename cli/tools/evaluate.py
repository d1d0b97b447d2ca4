"""`hrmctl eval`: a checkpoint's metrics, each accuracy with its 95% interval, on a split of its data or a puzzle file
(auralm.tools.evaluate.evaluate_checkpoint)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Annotated, Optional

import typer

from cli.tools.common import Checkpoint, DataDir, JsonOut, user_errors


def Positive(text: str):
    return Annotated[Optional[int], typer.Option(min=1, show_default=False, help=text)]


PuzzleFile = Annotated[Optional[str], typer.Option(
    "--puzzles", metavar="FILE", show_default=False,
    help="Evaluate on the puzzles of FILE instead (sudoku): 81 characters a line, '.' or '0' a blank, its solution "
         "after a comma (else the exact solver finds it), or a CSV with a question column (the public "
         "source,question,answer,rating; quizzes,solutions; puzzle,solution).")]


@contextmanager
def _progress(shown: bool):
    """A bar on stderr while the batches run (a terminal only): progress(done, total)."""
    if not shown:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("evaluating"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("eval", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def evaluate(checkpoint: Checkpoint, data: DataDir() = None,
             split: Annotated[str, typer.Option(help="The split to evaluate (val: the held-out puzzles).")] = "val",
             puzzles: PuzzleFile = None,
             batches: Positive("Evaluate only this many batches (default: the whole split).") = None,
             batch_size: Annotated[int, typer.Option(min=1, help="Examples per batch.")] = 256,
             segments: Positive("HRM/TRM: segments to run (default: the model's halt_max_steps; more may solve "
                                "more).") = None,
             json_out: JsonOut = False) -> int:
    """Evaluate a checkpoint: exact and cell accuracy with their 95% intervals, halting, accuracy by segments.

    On the CPU, batch by batch, over the split of the data the run trained on (or --data DIR), or over the puzzles
    of a file (--puzzles FILE)."""
    import json

    with user_errors(), _progress(sys.stderr.isatty() and not json_out) as progress:
        from auralm.tools.evaluate import evaluate_checkpoint

        out = evaluate_checkpoint(checkpoint, data, split, batches, batch_size, segments, puzzles, progress)
    if json_out:
        print(json.dumps(out))
        return 0
    intervals = out.pop("ci95", {})
    for k, v in out.items():
        if k in intervals:
            lo, hi = intervals[k]
            print(f"{k:22} {v:.4f}  (95% interval {lo:.4f}-{hi:.4f})")
        else:
            print(f"{k:22} {v:.4f}" if isinstance(v, float) else f"{k:22} {v}")
    return 0
