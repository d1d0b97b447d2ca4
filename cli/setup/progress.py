"""One progress bar per node for `hrmctl setup` (rich): the step it is at, and bytes while it sends.

It also serves cli/sync's node sync as its progress (start / grow / advance by name), so the bytes of the code
and the wheels move the same bar. Silent when not wanted (--json, --dry-run, not a terminal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cli.sync.run import OptionalBar

if TYPE_CHECKING:
    from rich.console import Console


class NodeBars(OptionalBar):
    def __init__(self, console: "Console | None", names: list[str], enabled: bool):
        self.bar = None
        self.tasks: dict[str, Any] = {}
        if enabled and console is not None:
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
            self.bar = Progress(TextColumn("{task.fields[node]:<10}"), TextColumn("{task.description:<22}"),
                                BarColumn(), DownloadColumn(), TimeElapsedColumn(), console=console)
            for name in names:
                self.tasks[name] = self.bar.add_task("connecting", node=name, total=None)

    def phase(self, name: str, text: str, total: int | None = None) -> None:
        """A new step: its text, and a bar of `total` bytes (None: a pulsing bar, no byte count)."""
        if name in self.tasks:
            task = self.tasks[name]
            self.bar.update(task, description=text, completed=0)
            with self.bar._lock:  # rich's update() takes total=None as "unchanged"
                self.bar._tasks[task].total = total

    def done(self, name: str, text: str) -> None:
        if name in self.tasks:
            task = self.tasks[name]
            total = self.bar.tasks[task].total or 1
            self.bar.update(task, description=text, total=total, completed=total)

    # cli/sync's progress interface
    def start(self, name: str, total: int) -> None:
        if name in self.tasks:
            self.bar.update(self.tasks[name], total=total, completed=0)

    def grow(self, name: str, more: int) -> None:
        if name in self.tasks:
            task = self.tasks[name]
            self.bar.update(task, total=(self.bar.tasks[task].total or 0) + more)

    def advance(self, name: str, n: int) -> None:
        if name in self.tasks:
            self.bar.update(self.tasks[name], advance=n)
