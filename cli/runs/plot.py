"""`hrmctl plot RUN [RUN ...]`: one metric of one or several runs, a line per run, as a PNG or in the terminal.

The reading and the PNG are the trainer's own (auralm.training.curves: the same code that writes each run's curves.png);
the terminal drawing is plotext's.
"""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING, Sequence

from auralm.training import curves

from cli.errors import HrmctlError
from cli.runs.catalog import Run, load_run, resolve

if TYPE_CHECKING:
    from rich.console import Console

Curve = tuple[str, list[float], list[float]]


def legend(runs: Sequence[Run]) -> list[str]:
    """Each run's id, and its sync mode and model when they are not the same for every run."""
    differ = [attr for attr in ("sync", "model") if len({getattr(r, attr) for r in runs}) > 1]
    labels = []
    for r in runs:
        extra = [str(getattr(r, a) or "?") for a in differ]
        labels.append(r.id + (f" ({', '.join(extra)})" if extra else ""))
    return labels


def gather(refs: Sequence[str], runs_dir: str, metric: str, x: str) -> tuple[list[Run], list[Curve], list[str]]:
    """The runs, their curves of METRIC against X, and notes about runs that have none. Unknown run, metric or
    x axis: one line (exit code 2)."""
    if x not in curves.X_LABELS:
        raise HrmctlError(f"--x {x}: choose one of {', '.join(curves.X_LABELS)}")
    runs: list[Run] = []
    for ref in refs:
        path = resolve(ref, runs_dir)
        if all(r.path.resolve() != path.resolve() for r in runs):
            runs.append(load_run(path))
    records = [curves.read_metrics(r.trainer_dir) for r in runs]
    with_data = [rec for rec in records if rec]
    if not with_data:
        names = ", ".join(r.id for r in runs)
        raise HrmctlError(f"no metrics to plot: {names} {'has' if len(runs) == 1 else 'have'} no records in "
                          f"metrics.jsonl (still starting, or trained elsewhere)", exit_code=1)
    available = list(dict.fromkeys(k for rec in with_data for k in curves.metric_names(rec)))
    if metric not in available:
        raise HrmctlError(f"unknown metric '{metric}'; available: {', '.join(available)}")
    axes = [a for a in curves.X_LABELS if all(a in curves.x_axes(rec) for rec in with_data)]
    if x not in axes:
        raise HrmctlError(f"--x {x}: not logged by every run; available: {', '.join(axes)}")
    lines, notes = [], []
    for r, rec, label in zip(runs, records, legend(runs)):
        xs, ys = curves.series(rec, metric, x) if rec else ([], [])
        if xs:
            lines.append((label, xs, ys))
        else:
            notes.append(f"{r.id}: no {metric} in its metrics" if rec else f"{r.id}: no metrics yet")
    return runs, lines, notes


def plot(refs: Sequence[str], *, runs_dir: str, metric: str, x: str, out_file: str | None,
         console: "Console", err: "Console") -> int:
    runs, lines, notes = gather(refs, runs_dir, metric, x)
    for note in notes:
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    title = curves.run_title(runs[0].trainer_dir) if len(runs) == 1 else f"{metric}: {len(lines)} runs"
    if out_file:
        try:
            path = curves.draw(lines, metric, out_file, x=x, title=title)
        except ImportError as exc:
            raise HrmctlError(f"matplotlib is not installed here ({exc}): `pip install matplotlib`", exit_code=1)
        except OSError as exc:
            raise HrmctlError(f"cannot write {out_file}: {exc.strerror or exc}", exit_code=1)
        console.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
        return 0
    sys.stdout.write(terminal_plot(lines, metric, x, title, color=sys.stdout.isatty()) + "\n")
    sys.stdout.flush()
    return 0


def terminal_plot(lines: Sequence[Curve], metric: str, x: str, title: str, *, color: bool = True,
                  size: tuple[int, int] | None = None) -> str:
    """The curves drawn with plotext, as text."""
    try:
        import plotext as plt
    except ImportError:
        raise HrmctlError("plotext is not installed here: `pip install plotext`, or write a PNG with --out FILE.png",
                          exit_code=1) from None
    cols, rows = size or shutil.get_terminal_size((100, 30))
    plt.clear_figure()
    plt.plotsize(max(40, min(cols, 160)), max(12, min(rows - 3, 40)))
    if not color:
        plt.theme("clear")
    every = [y for _, _, ys in lines for y in ys]
    if every and min(every) > 0 and max(every) / min(every) > 20:
        plt.yscale("log")
    for label, xs, ys in lines:
        plt.plot(xs, ys, label=label, marker="braille")
    plt.title(title)
    plt.xlabel(curves.X_LABELS[x])
    plt.ylabel(metric)
    text = plt.build()
    return text if color else plt.uncolorize(text)  # the clear theme still resets colours per line
