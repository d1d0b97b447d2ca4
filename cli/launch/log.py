"""One log for the whole job: every node's lines, live, prefixed with node and rank, one colour
per node; rank 0's `step N/M` lines drive a progress bar; each node's lines also go to
runs/<run-id>/<node>.log, which starts with the exact command and environment (secrets left out).
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cli.launch.plan import NodeLaunch, redacted
from cli.launch.node_torchrun import FACTS_TAG

COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_magenta"]
RANK_RE = re.compile(r"^\[rank(\d+)\]:")
STEP_RE = re.compile(r"^step (\d+)/(\d+)")
ROOT_CAUSE_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
EXITCODE_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
ROOT_CAUSE = "Root Cause (first observed failure)"  # torchrun's report: other failures come before it
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _stamp() -> str:
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def header_lines(plan: NodeLaunch, attempt: int) -> list[str]:
    """What the node's log file starts with: the exact command and environment, secrets hidden."""
    lines = [f"# hrmctl launch, attempt {attempt}, node {plan.node.name} (node rank {plan.node_rank}, "
             f"ranks {plan.ranks.start}-{plan.ranks.stop - 1}), host {plan.node.host}",
             f"# cwd: {plan.cwd}",
             f"# command: {plan.shell_line(redact=True)}"]
    lines += [f"# env: {k}={v}" for k, v in redacted(plan.env).items()]
    return lines


class MergedLog:
    """Thread-safe sink for the lines of every node; `handler(plan)` gives a Job's on_line."""

    def __init__(self, console: Console, run_dir: Path, plans: list[NodeLaunch], *, quiet: bool = False,
                 on_result: Callable[[str, str], None] | None = None, result_tag: str | None = None):
        self.console = console
        self.run_dir = run_dir
        self.quiet = quiet
        self.on_result = on_result
        self.result_tag = result_tag
        self.lock = threading.Lock()
        self.colour = {p.node.name: COLOURS[i % len(COLOURS)] for i, p in enumerate(plans)}
        self.width = max(len(p.node.name) for p in plans)
        self.files = {}
        self.failed_rank: dict[str, int] = {}  # node -> first rank torchrun blamed (its "Root Cause")
        self.exitcode: dict[str, int] = {}  # node -> that rank's exit code (negative: killed by that signal)
        self.in_root_cause: set[str] = set()
        self.node_facts: dict[str, dict] = {}  # what cli.launch.node_torchrun reported, by node
        self.first_step_at: float | None = None
        self.progress: Progress | None = None
        self.task = None
        run_dir.mkdir(parents=True, exist_ok=True)

    def start(self, plans: list[NodeLaunch], attempt: int) -> None:
        for p in plans:
            fh = self.files.get(p.node.name)
            if fh is None:
                fh = self.files[p.node.name] = open(self.run_dir / f"{p.node.name}.log", "a", encoding="utf-8")
            fh.write("\n".join(header_lines(p, attempt)) + "\n")
            fh.flush()
        self.failed_rank.clear()
        self.exitcode.clear()
        self.in_root_cause.clear()
        self.node_facts.clear()

    def handler(self, plan: NodeLaunch) -> Callable[[str, str], None]:
        name = plan.node.name
        default_rank = plan.first_rank if plan.nproc == 1 else None
        return lambda stream, line: self.line(name, default_rank, line)

    def line(self, node: str, default_rank: int | None, raw: str) -> None:
        text = ANSI_RE.sub("", raw)
        m = RANK_RE.match(text)
        rank = int(m.group(1)) if m else None
        body = text[m.end():] if m else text
        with self.lock:
            fh = self.files.get(node)
            if fh is not None:
                fh.write(f"{_stamp()} {text}\n")
                fh.flush()
            self._watch_failure(node, body)
            if body.startswith(FACTS_TAG):  # for the launcher, not for the reader
                self._node_facts(node, body[len(FACTS_TAG):])
                return
            if self.result_tag and body.startswith(self.result_tag):
                if self.on_result:
                    self.on_result(node, body[len(self.result_tag):])
                return
            step = STEP_RE.match(body) if rank in (0, None) else None
            if step and (rank == 0 or default_rank == 0):
                self._step(int(step.group(1)), int(step.group(2)))
            if self.quiet:
                return
            who = f"{node:<{self.width}}" + (f" r{rank}" if rank is not None else "   ")
            out = self.progress.console if self.progress else self.console
            out.print(f"[{self.colour[node]}]{escape(who)} │[/] {escape(body)}", highlight=False, soft_wrap=True)

    def _watch_failure(self, node: str, body: str) -> None:
        """torchrun's failure report names rank and exit code of its root cause (after its "Failures:" list of
        the others): the first rank and exitcode after the "Root Cause" line."""
        if ROOT_CAUSE in body:
            self.in_root_cause.add(node)
            return
        if node not in self.in_root_cause:
            return
        m = ROOT_CAUSE_RANK_RE.match(body)
        if m and node not in self.failed_rank:
            self.failed_rank[node] = int(m.group(1))
        m = EXITCODE_RE.match(body)
        if m and node not in self.exitcode:
            self.exitcode[node] = int(m.group(1))

    def _node_facts(self, node: str, text: str) -> None:
        try:
            self.node_facts[node] = json.loads(text)
        except ValueError:
            pass

    def _step(self, step: int, total: int) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.monotonic()
        if self.quiet or not self.console.is_terminal:
            return
        if self.progress is None:
            self.progress = Progress(TextColumn("rank 0"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                                     TimeRemainingColumn(), console=self.console, transient=False)
            self.progress.start()
            self.task = self.progress.add_task("train", total=total)
        self.progress.update(self.task, completed=step, total=total)

    def note(self, text: str, node: str | None = None) -> None:
        """A line from hrmctl itself (also written to the node's file, or to every file)."""
        with self.lock:
            for name, fh in self.files.items():
                if node is None or name == node:
                    fh.write(f"# hrmctl: {text}\n")
                    fh.flush()
            out = self.progress.console if self.progress else self.console
            out.print(f"[bold]hrmctl[/bold] {escape(text)}", highlight=False, soft_wrap=True)

    def close(self) -> None:
        with self.lock:
            if self.progress is not None:
                self.progress.stop()
                self.progress = None
            for fh in self.files.values():
                fh.close()
            self.files.clear()
