"""One log for the whole job: every node's lines, live, prefixed with node and rank, one colour
per node; rank 0's `step N/M` lines drive a progress bar; each node's lines also go to
runs/<run-id>/<node>.log, which starts with the exact command and environment (secrets left out).

The files are the record: they get every line whatever happens to the terminal. When nobody reads
the output any more (a pipe's reader gone: EPIPE, or poll's POLLERR/POLLHUP on it; a terminal hung
up: EIO), the output is pointed at /dev/null and `gone` says why: the launcher stops the run, as for a
closed terminal. torchrun's `SignalException` traceback (its agent stopped by a signal: our own stop)
becomes one line in the file and nothing on the screen; so does its `ChildFailedError` traceback after a rank's
stop line (the trainer's one line, auralm.errors.STOP_TAG, says why; torchrun's report of the ranks stays).
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from auralm.errors import STOP_TAG
from cli.launch.plan.plan import NodeLaunch, redacted
from node.torchrun import FACTS_TAG

COLOURS = ["cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_magenta"]
RANK_RE = re.compile(r"^\[rank(\d+)\]:")
STEP_RE = re.compile(r"^step (\d+)/(\d+)")
# rank 0's line once the checkpoint a SIGUSR1 asked for is written (auralm/training/stop_request.py stop_line)
SAVED_ON_REQUEST_RE = re.compile(r"^stopped at step \d+/\d+ on SIGUSR1: checkpoint .+ saved;")
ROOT_CAUSE_RANK_RE = re.compile(r"^\s*rank\s*:\s*(\d+)")
EXITCODE_RE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
ROOT_CAUSE = "Root Cause (first observed failure)"  # torchrun's report: other failures come before it
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TRACEBACK = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception, another exception occurred:",
           "The above exception was the direct cause of the following exception:")
LOGGER_PREFIX_RE = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ?")  # torch's log lines
SIGNAL_NOTE_RE = re.compile(r"\bSignalException$")
# torch's c10d at each of a run's connections whose peer address has no name (no reverse DNS on the LAN, as on most home
# networks, or no DNS server): harmless, and on every node at every launch; the node's file keeps it, the screen not
# (a DNS server that does not answer slows the start: the launch plan's note says so, docs/train.md)
NO_REVERSE_DNS_RE = re.compile(r"\[c10d\] The hostname of the client socket cannot be retrieved")
# torchrun's agent stopped by a signal: "...SignalException: Process 123 got signal: 15" ("Signals.SIGTERM" before
# Python 3.11)
SIGNAL_EXCEPTION_RE = re.compile(r"^\S*SignalException: Process \d+ got signal: (?:Signals\.)?(\w+)")
# torchrun's own traceback when a worker failed: after a trainer's stop (STOP_TAG) it says nothing the stop did not
CHILD_FAILED_RE = re.compile(r"^\S*ChildFailedError:")
GONE_ERRNOS = (errno.EPIPE, errno.EIO, errno.ECONNRESET)  # a pipe without reader, a hung-up terminal, a socket


def _stamp() -> str:
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"


def reader_gone(stream) -> bool:
    """Whether nobody reads `stream` any more: poll's POLLERR (a pipe whose reader exited) or POLLHUP (a
    hung-up terminal, a socket closed by its peer). A file, /dev/null or a missing stream: never."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in poller.poll(0))


def to_devnull(stream) -> None:
    """Point the file descriptor of `stream` at /dev/null: what is still written to it (a buffer flushed at
    exit, a last line) goes nowhere instead of failing."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (AttributeError, OSError, ValueError):
        return
    os.dup2(null, fd)
    os.close(null)


def _broken_pipe() -> None:
    raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def header_lines(plan: NodeLaunch, attempt: int, after: str = "") -> list[str]:
    """What the node's log file starts with: the exact command and environment, secrets hidden. ``after``: why the
    launch was made again within the attempt ("node1 left", "node1 joined": cli/launch/supervise/elastic.py)."""
    lines = [f"# hrmctl launch, attempt {attempt}{f' (after {after})' if after else ''}, node {plan.node.name} "
             f"(node rank {plan.node_rank}, "
             f"ranks {plan.ranks.start}-{plan.ranks.stop - 1}), host {plan.node.host}",
             f"# cwd: {plan.cwd}",
             f"# command: {plan.shell_line(redact=True)}"]
    lines += [f"# env: {k}={v}" for k, v in redacted(plan.env).items()]
    return lines


@dataclass
class Held:
    """A node's line as it came: stamped for the file, its rank, the plan's rank for the node, the text after the
    rank's prefix."""
    line: str
    rank: int | None
    default_rank: int | None
    body: str


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
        self.node_facts: dict[str, dict] = {}  # what node/torchrun.py reported, by node
        self.stops: list[tuple[str, dict]] = []  # (node, the trainer's stop: reason, rank), in the order they came
        self.first_step_at: float | None = None
        self.on_first_step: Callable[[], None] | None = None  # told once, at rank 0's first step line
        self.stepped = False
        self.saved_on_request = False  # rank 0 said the checkpoint a SIGUSR1 asked for is written (this attempt)
        self.progress: Progress | None = None
        self.task = None
        self.gone: str | None = None  # why the output has no reader any more (then nothing more is shown)
        self.hushed = False  # after a stop asked for (a signal, the reader gone): the nodes' lines to the files only
        self.pending: dict[tuple[str, int | None], list[Held]] = {}
        self.signal_noted: set[str] = set()  # nodes whose torchrun's SignalException was left out  # a traceback being read, by node and rank
        # rich's own answer to a broken pipe is to point stdout at /dev/null and raise SystemExit, which in a thread
        # that reads a node ends that thread without a word (and the run goes on unseen): here it is an error
        getattr(console, "console", console).on_broken_pipe = _broken_pipe  # cli.app's LazyConsole holds rich's
        run_dir.mkdir(parents=True, exist_ok=True)

    def start(self, plans: list[NodeLaunch], attempt: int, after: str = "") -> None:
        for p in plans:
            fh = self.files.get(p.node.name)
            if fh is None:
                fh = self.files[p.node.name] = open(self.run_dir / f"{p.node.name}.log", "a", encoding="utf-8")
            fh.write("\n".join(header_lines(p, attempt, after)) + "\n")
            fh.flush()
        self.stepped = False  # rank 0 logged a step in this attempt
        self.saved_on_request = False
        self.failed_rank.clear()
        self.exitcode.clear()
        self.in_root_cause.clear()
        self.node_facts.clear()
        self.stops.clear()
        self.signal_noted.clear()

    def handler(self, plan: NodeLaunch) -> Callable[[str, str], None]:
        name = plan.node.name
        default_rank = plan.first_rank if plan.nproc == 1 else None
        return lambda stream, line: self.line(name, default_rank, line)

    def line(self, node: str, default_rank: int | None, raw: str) -> None:
        text = ANSI_RE.sub("", raw)
        m = RANK_RE.match(text)
        rank = int(m.group(1)) if m else None
        body = text[m.end():] if m else text
        held = Held(f"{_stamp()} {text}", rank, default_rank, body)
        with self.lock:
            if not self._traceback(node, held):
                self._record(node, held.line)
                self._take(node, held)

    def _record(self, node: str, line: str) -> None:
        fh = self.files.get(node)
        if fh is not None:
            fh.write(line + "\n")
            fh.flush()

    def _take(self, node: str, held: "Held") -> None:
        """A node's line, already in its file: what it tells the launcher, and the screen."""
        rank, body = held.rank, held.body
        self._watch_failure(node, body)
        if body.startswith(FACTS_TAG):  # for the launcher, not for the reader
            self._node_facts(node, body[len(FACTS_TAG):])
            return
        if body.startswith(STOP_TAG):  # the trainer's own reason for a stop a restart cannot fix (auralm.errors)
            self._stop(node, body[len(STOP_TAG):])
            return
        if self.result_tag and body.startswith(self.result_tag):
            if self.on_result:
                self.on_result(node, body[len(self.result_tag):])
            return
        if self.stops and rank is None:  # the trainer said why: torchrun's own lines (its failure report, its
            return  # ChildFailedError traceback) go to the node's file only; hrmctl's last line is the trainer's
        if rank == 0 or (rank is None and held.default_rank == 0):
            step = STEP_RE.match(body)
            if step:
                self._step(int(step.group(1)), int(step.group(2)))
            elif SAVED_ON_REQUEST_RE.match(body):
                self.saved_on_request = True
        if self.quiet or self.hushed or NO_REVERSE_DNS_RE.search(body):
            return
        who = f"{node:<{self.width}}" + (f" r{rank}" if rank is not None else "   ")
        self._show(f"[{self.colour[node]}]{escape(who)} │[/] {escape(body)}")

    def _traceback(self, node: str, held: "Held") -> bool:
        """Hold a traceback until its exception's line: torchrun's SignalException (its agent stopped by a signal,
        which is our stop) becomes one line in the node's file and nothing on the screen, with what is chained to
        it; any other goes on as it came. torchrun's logger prefixes each line (`E1126 10:33:30.384000 10266
        tail_log.py:154] `), its note of the exception ends in `SignalException`. False when the line is not part
        of a traceback (and is for the caller to take)."""
        key, text = (node, held.rank), LOGGER_PREFIX_RE.sub("", held.body, count=1)
        if SIGNAL_NOTE_RE.search(text):  # torchrun's logger: "error in log tailer for default0. SignalException"
            return True
        lines = self.pending.get(key)  # [] right after a SignalException's: what may be chained to it
        if lines is None:
            if text != TRACEBACK:
                return False
            self.pending[key] = [held]
            return True
        if not lines and not text.strip():  # a blank line after the stop's traceback: part of it
            return True
        if text == TRACEBACK or not text.strip() or text[0].isspace() or text in CHAINED:
            lines.append(held)  # a frame, its source, a blank line, a chained traceback
            return True
        m = SIGNAL_EXCEPTION_RE.match(text)
        if m and any(LOGGER_PREFIX_RE.sub("", h.body, count=1) == TRACEBACK for h in lines):
            self.pending[key] = []  # the exception's own line: the end of it, unless another is chained to it
            sig = m.group(1)
            if node not in self.signal_noted:  # once: a second signal during torchrun's stop chains another
                self.signal_noted.add(node)
                self._record(node, f"# hrmctl: torchrun ended on {signal_name(int(sig)) if sig.isdigit() else sig} "
                                   f"(the stop's tracebacks left out)")
            return True
        del self.pending[key]
        if CHILD_FAILED_RE.match(text) and any(n == node for n, _ in self.stops):
            self._record(node, "# hrmctl: torchrun's ChildFailedError traceback left out (the trainer's stop above "
                               "says why; torchrun's report of the ranks follows)")
            return True
        self._release(node, lines)
        return False  # the exception line itself (or a line after a dropped traceback) goes on like any other

    def _release(self, node: str, lines: list["Held"]) -> None:
        for held in lines:
            self._record(node, held.line)
            self._take(node, held)

    def flush(self) -> None:
        """Whatever is still held (a traceback cut short: its process ended mid-way) goes on as it came."""
        with self.lock:
            for key in list(self.pending):
                self._release(key[0], self.pending.pop(key))

    def _show(self, markup: str) -> None:
        """One line on the screen, unless nobody reads it any more: then the output goes to /dev/null and
        `gone` says why (the run is stopped by the launcher; the files keep every line)."""
        if self.gone:
            return
        out = self.progress.console if self.progress else self.console
        with self._screen():
            out.print(markup, highlight=False, soft_wrap=True)

    @contextmanager
    def _screen(self):
        """Around a write to the screen: a reader gone (EPIPE, a hung-up terminal's EIO) is noted, not raised."""
        try:
            yield
        except OSError as exc:
            if exc.errno not in GONE_ERRNOS:
                raise
            self._lose_output(f"{os.strerror(exc.errno)} writing it")

    def output_gone(self) -> str | None:
        """Why nobody reads the output any more (see `gone`), looking at stdout and the log's stream now."""
        if not self.gone:
            for stream in {id(s): s for s in (sys.stdout, self.console.file)}.values():
                if reader_gone(stream):
                    self._lose_output("a pipe without reader")
                    break
        return self.gone

    def _lose_output(self, why: str) -> None:
        self.gone = self.gone or f"nobody reads the output any more ({why}; taken as a closed terminal)"
        for stream in {id(s): s for s in (sys.stdout, self.console.file)}.values():
            if reader_gone(stream) or stream is self.console.file:
                to_devnull(stream)

    def hush(self) -> None:
        """From now on the nodes' lines go to their files only (a stop was asked for: what the nodes print while
        they are stopped is not for the screen)."""
        self.hushed = True

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

    def _stop(self, node: str, text: str) -> None:
        try:
            doc = json.loads(text)
        except ValueError:
            return
        if isinstance(doc, dict) and isinstance(doc.get("reason"), str):
            self.stops.append((node, doc))

    def stop_reason(self, node: str, rank: int | None) -> tuple[str, dict] | None:
        """The trainer's own stop (see auralm.errors.STOP_TAG) for a failure blamed on `rank` on `node`: that rank's,
        else the first one any rank gave (a bad-input stop is said by rank 0 only, while every rank exits)."""
        with self.lock:
            mine = [s for s in self.stops if s[0] == node and s[1].get("rank") == rank]
            return (mine or self.stops or [None])[0]

    def _node_facts(self, node: str, text: str) -> None:
        try:
            self.node_facts[node] = json.loads(text)
        except ValueError:
            pass

    def _step(self, step: int, total: int) -> None:
        self.stepped = True
        if self.first_step_at is None:
            self.first_step_at = time.monotonic()
            if self.on_first_step:
                self.on_first_step()
        if self.quiet or self.gone or not self.console.is_terminal:
            return
        with self._screen():
            if self.progress is None:  # refreshed here, not by a thread of its own: every write is guarded
                self.progress = Progress(TextColumn("rank 0"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                                         TimeRemainingColumn(), console=self.console, transient=False,
                                         auto_refresh=False)
                self.progress.start()
                self.task = self.progress.add_task("train", total=total)
            self.progress.update(self.task, completed=step, total=total, refresh=True)

    def note(self, text: str, node: str | None = None, show: bool = True) -> None:
        """A line from hrmctl itself (also written to the node's file, or to every file); `show=False`: files only."""
        with self.lock:
            for name in self.files:
                if node is None or name == node:
                    self._record(name, f"# hrmctl: {text}")
            if show:
                self._show(f"[bold]hrmctl[/bold] {escape(text)}")

    def close(self) -> None:
        self.flush()
        for stream in (sys.stdout, sys.stderr):  # a terminal hung up (SIGHUP): the last lines go nowhere, not in error
            if reader_gone(stream):
                to_devnull(stream)
        with self.lock:
            if self.progress is not None:
                with self._screen():
                    self.progress.stop()
                self.progress = None
            for fh in self.files.values():
                fh.close()
            self.files.clear()
