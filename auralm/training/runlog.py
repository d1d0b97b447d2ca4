"""What rank 0 reports: lines on stdout, and ``config.json``, ``metrics.jsonl``, ``events.jsonl`` in the run directory;
with ``logging.tensorboard`` / ``logging.wandb`` the same metrics to TensorBoard and W&B (auralm.training.tracking); on
a
terminal, a progress bar with the time remaining below the lines.

On every other rank a RunLog is silent, so the trainer can call it without asking who it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

from auralm.training import tracking


class RunLog:
    _open: list[RunLog] = []  # rank 0's logs not closed yet (see closing)

    def __init__(self, out_dir: Path | None, plan: tracking.Plan | None = None):
        self.out_dir = out_dir  # None: not rank 0
        self.plan = plan or tracking.Plan()
        self.sinks: list = []
        self._bar = None  # the progress bar once started (a terminal only)
        self._task = None
        self._info = ""
        self.terminal = out_dir is not None and _is_terminal(sys.stdout)
        if out_dir is not None:
            RunLog._open.append(self)

    def say(self, line: str, err: bool = False) -> None:
        if self.out_dir is not None:
            print(line, file=sys.stderr if err else sys.stdout, flush=True)

    def _append(self, name: str, record: dict) -> None:
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / name, "a") as f:
                f.write(json.dumps(record) + "\n")

    def config(self, cfg: dict, step: int = 0) -> None:
        """The resolved config, written when the run directory is first written; the tracking sinks open here
        (``step``: where training starts, a resumed run's step)."""
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
            if not self.plan.empty and not self.sinks:
                self.sinks = tracking.open_sinks(self.plan, self.out_dir, cfg, step, self.say)

    def metrics(self, record: dict) -> None:
        self._append("metrics.jsonl", record)
        for sink in list(self.sinks):
            try:
                sink.log(record, record["step"])
            except Exception as e:  # rank 0 alone: an error here would leave the other ranks waiting
                self.sinks.remove(sink)
                self.say(f"warning: {sink.name} logging stopped at step {record['step']} ({type(e).__name__}: "
                         f"{e}); the metrics are in metrics.jsonl", err=True)
        if self._bar is not None and record.get("loss") is not None:
            self._info = f"loss {record['loss']:.4f}"
            self._bar.update(self._task, info=self._info)

    def event(self, step: int, kind: str, message: str, rank: int | list[int] = 0, **fields) -> None:
        """One line on stdout and one record in events.jsonl: step, kind, rank(s), what was done."""
        self.say(message)
        self._append("events.jsonl", {"step": step, "kind": kind, "rank": rank, "message": message, **fields})

    def progress(self, step: int, total: int) -> None:
        """Where training stands, every step: on a terminal a bar (rich) with the time elapsed and remaining, the
        lines scrolling above it; otherwise nothing (the plain lines are the log)."""
        if not self.terminal:
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(TextColumn("step {task.completed:.0f}/{task.total:.0f}"), BarColumn(),
                                 TaskProgressColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[info]}"), console=Console(file=sys.stdout),
                                 refresh_per_second=4, redirect_stderr=_is_terminal(sys.stderr))
            self._task = self._bar.add_task("train", total=total, completed=step, info=self._info)
            self._bar.start()
        else:
            self._bar.update(self._task, completed=step, total=total)  # a total the budget planned again

    def close(self, failed: bool = False) -> None:
        """Stop the bar, close the sinks (a W&B run is marked failed when ``failed``). Idempotent."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        self.terminal = False
        sinks, self.sinks, self.plan = self.sinks, [], tracking.Plan()
        for sink in sinks:
            try:
                sink.close(failed)
            except Exception as e:
                self.say(f"warning: closing {sink.name} logging: {type(e).__name__}: {e}", err=True)
        if self in RunLog._open:
            RunLog._open.remove(self)

    @classmethod
    @contextlib.contextmanager
    def closing(cls):
        """Around a training: every RunLog made inside is closed at its end, however it ends (the trainer's process
        leaves with os._exit, so nothing is left to atexit handlers: the terminal's cursor, W&B's run)."""
        before = len(cls._open)
        failed = True
        try:
            yield
            failed = False
        finally:
            for log in cls._open[before:]:
                log.close(failed)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False
