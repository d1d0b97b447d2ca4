"""`hrmctl logs RUN`: a run's node logs (runs/<run-id>/<node>.log), merged in time order, or one node's; --follow.

The launcher stamps every line it receives with this machine's clock (``HH:MM:SS.mmm text``; its own notes and each
attempt's header start with ``#``), so the nodes' files merge by those stamps; a line without one keeps the place
of the line before it, and a stamp far below the previous one is the next day. With --follow the files are read
again every POLL_S as they grow, new nodes' files included, until the run is no longer running (or Ctrl-C).
"""

from __future__ import annotations

import heapq
import os
import re
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, TextIO

from cli.errors import HrmctlError
from cli.runs.catalog import STATUS_FILE, is_running

STAMP_RE = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) ")
POLL_S = 0.5
STATUS_EVERY_S = 1.0
DAY_S = 86400.0


def keyed(lines: Iterable[str]) -> Iterator[tuple[float, str]]:
    """Each line with its time (seconds, days counted across midnight); unstamped lines keep the previous time."""
    day, prev, at = 0, None, 0.0
    for line in lines:
        m = STAMP_RE.match(line)
        if m:
            t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)) + int(m.group(4)) / 1000
            if prev is not None and t < prev - DAY_S / 2:
                day += 1
            prev = t
            at = max(at, day * DAY_S + t)
        yield at, line


def merged(files: dict[str, list[str]]) -> Iterator[tuple[str, str]]:
    """(node, line) of every file in time order; each file's own order kept."""
    def stream(i: int, node: str, lines: list[str]) -> Iterator[tuple[float, int, int, str, str]]:
        for n, (at, line) in enumerate(keyed(lines)):
            yield at, i, n, node, line

    streams = [stream(i, node, lines) for i, (node, lines) in enumerate(files.items())]
    for _, _, _, node, line in heapq.merge(*streams):
        yield node, line


class Tail:
    """A growing file read in whole lines: what was added since the last read."""

    def __init__(self, path: Path):
        self.path, self.offset, self.rest = path, 0, b""

    def read(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.rest + data
        lines = data.split(b"\n")
        self.rest = lines.pop()  # the part of a line still being written
        if final and self.rest:
            lines.append(self.rest)
            self.rest = b""
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in lines]


def _prefix(width: int, many: bool) -> Callable[[str, str], str]:
    if not many:
        return lambda node, line: line
    return lambda node, line: f"{node:<{width}} │ {line}"


def _emit(out: TextIO, text_lines: list[str]) -> None:
    if text_lines:
        out.write("\n".join(text_lines) + "\n")
        out.flush()


def show_logs(run_path: Path, *, node: str | None = None, follow: bool = False, out: TextIO | None = None,
              poll: float = POLL_S, running: Callable[[Path], bool] = is_running, last: int | None = None) -> int:
    """``last``: only the last N merged lines of what is there now (then, with ``follow``, every new one)."""
    out = out or sys.stdout
    try:
        return _show(run_path, node, follow, out, poll, running, last)
    except BrokenPipeError:  # `hrmctl logs RUN | head`: the reader has had enough
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 0


def _node_files(run_path: Path, node: str | None) -> dict[str, Path]:
    files = {p.stem: p for p in sorted(run_path.glob("*.log"))}
    if node is None:
        return files
    if node not in files:
        have = ", ".join(files) or "none"
        raise HrmctlError(f"run {run_path.name} has no log of node '{node}'; its nodes: {have}")
    return {node: files[node]}


def _show(run_path: Path, node: str | None, follow: bool, out: TextIO, poll: float,
          running: Callable[[Path], bool], last: int | None = None) -> int:
    files = _node_files(run_path, node)
    if not files and not follow:
        launched = (run_path / STATUS_FILE).exists()
        hint = "no node has written a line yet" if launched else "the trainer was run without `hrmctl train`"
        raise HrmctlError(f"run {run_path.name} has no node logs (<node>.log): {hint}", exit_code=1)
    tails = {name: Tail(path) for name, path in files.items()}
    width = max((len(n) for n in tails), default=4)
    many = node is None and len(tails) > 1
    fmt = _prefix(width, many)
    first = {name: t.read(final=not follow) for name, t in tails.items()}
    shown = [fmt(n, line) for n, line in merged(first)]
    _emit(out, shown[-last:] if last else shown)
    if not follow:
        return 0
    checked = 0.0
    while True:
        time.sleep(poll)
        if node is None:  # a node whose first line arrives later
            for name, path in _node_files(run_path, None).items():
                if name not in tails:
                    tails[name] = Tail(path)
                    width, many = max(width, len(name)), len(tails) > 1
                    fmt = _prefix(width, many)
        now = time.monotonic()
        done = False
        if now - checked >= STATUS_EVERY_S:
            checked = now
            done = not running(run_path)
        _emit(out, [fmt(name, line) for name, t in tails.items() for line in t.read(final=done)])
        if done:
            return 0
