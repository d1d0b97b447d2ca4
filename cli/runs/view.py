"""`hrmctl runs`: the catalog as a rich table for people, or JSON for scripts."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cli.runs.catalog import Run, list_runs, number
from cli.runs.states import RunState

if TYPE_CHECKING:
    from rich.console import Console

STYLE = {RunState.QUEUED: "blue", RunState.RUNNING: "cyan", RunState.FINISHED: "green", RunState.FAILED: "bold red",
         RunState.STOPPED: "yellow", RunState.UNKNOWN: "dim"}


def duration_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def start_text(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts is not None else "-"


def steps_text(run: Run) -> str:
    if run.steps is None:
        return "-"
    return f"{run.steps}/{run.max_steps}" if run.max_steps else str(run.steps)


def best_text(run: Run) -> str:
    """The exact accuracy of a puzzle task when it was evaluated, else the best validation loss."""
    if run.best_exact_accuracy is not None:
        return f"exact {run.best_exact_accuracy:.3f}"
    if run.best_val_loss is not None:
        return f"val_loss {run.best_val_loss:.4f}"
    return "-"


def nodes_text(run: Run) -> str:
    if not run.nodes:
        return "-"
    text = ",".join(run.nodes)
    return text if len(text) <= 24 else f"{len(run.nodes)} nodes"


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


COLUMNS = ("id", "start", "duration", "nodes", "task", "model", "status", "steps", "best")
DROPPED_FIRST = ("task", "nodes", "start", "duration")
COLUMN_OPTIONS = {"id": {"no_wrap": True, "style": "bold"}, "duration": {"justify": "right"},
                  "steps": {"justify": "right"}}


def _cells(r: Run) -> dict[str, str]:
    from rich.markup import escape

    return {"id": escape(r.id), "start": start_text(r.start), "duration": duration_text(r.duration),
            "nodes": escape(nodes_text(r)), "task": escape(r.task or "-"), "model": escape(r.model or "-"),
            "status": f"[{STYLE[r.status]}]{r.status}[/]" + (f" [dim](slurm {r.slurm_job} {r.slurm_state})[/]"
                                                             if r.slurm_job else ""), "steps": steps_text(r), "best": best_text(r)}


def _table(runs: list[Run], columns: list[str], title: str):
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, collapse_padding=True)
    for name in columns:
        table.add_column(name, **{"no_wrap": True, **COLUMN_OPTIONS.get(name, {})})
    for r in runs:
        cells = _cells(r)
        table.add_row(*(cells[c] for c in columns))
    return table


def show_runs(runs_dir: str, *, as_json: bool, console: "Console") -> int:
    """The runs under RUNS_DIR, the newest first; none (or no such directory) is a line, and exit code 0."""
    runs = list_runs(runs_dir)
    if as_json:
        _write(json.dumps([r.to_dict() for r in runs], indent=2))
        return 0
    where = Path(runs_dir)
    if not runs:
        what = "no such directory" if not where.is_dir() else "no runs there"
        _write(f"no runs in {where}/ ({what}); `hrmctl train` writes each run to runs/<run-id>/")
        return 0
    from rich.console import Console
    from rich.markup import escape

    if not console.is_terminal:  # into a pipe or a file: the table at its natural width, not squeezed into 80
        console = Console(file=sys.stdout, width=max(console.width, 400), highlight=False)
    title = escape(f"runs in {where}/ ({len(runs)}, newest first)")
    shown = list(COLUMNS)
    table = _table(runs, shown, title)
    wide = Console(width=10_000, file=io.StringIO())  # console.measure stops at the console's own width
    for drop in DROPPED_FIRST:  # a narrow terminal: fewer columns rather than columns one letter wide
        if wide.measure(table).maximum <= console.width:
            break
        shown.remove(drop)
        table = _table(runs, shown, title)
    console.print(table)
    for r in runs:  # why a run did not finish, and the nodes that left and joined it, under the table
        if r.status in (RunState.FAILED, RunState.STOPPED, RunState.UNKNOWN) and r.reason:
            console.print(f"[{STYLE[r.status]}]{escape(r.id)}[/]: {escape(r.reason)}", highlight=False,
                          soft_wrap=True)
        if r.members:
            console.print(f"{escape(r.id)}: " + "; ".join(_member_event(e) for e in r.members), highlight=False,
                          soft_wrap=True)
    return 0


def _member_event(e: dict) -> str:
    from rich.markup import escape

    t = number(e.get("t"))
    when = time.strftime("%H:%M:%S", time.localtime(t)) if t is not None else "?"
    return escape(f"{e.get('node')} {e.get('event')} at {when}")
