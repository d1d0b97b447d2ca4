"""`hrmctl sync-data`: make the nodes' dataset match the local one, over SSH, atomically.

For the launcher (`hrmctl train --sync-data`) and other callers:

    report = sync_nodes(nodes, "data", checksum=False, delete=False, dry_run=False, console=console)
    report.raise_for_errors()      # SyncError naming the first node that failed
    report.nodes                   # one NodeSync per node: sent_files, sent_bytes, resumed_bytes, ...

`nodes` are resolved inventory Nodes; each is synced to `dest` or its own `data_path`, all in
parallel. Per node: its manifest is computed by its own Python (node/sync_receiver.py), compared
with the source's (size + mtime, or SHA-256 with checksum=True; cli/sync/plan.py), and only new
or changed files are written to `.NAME.hrmctl-part` beside the target: large files with many
SFTP requests in flight (cli/sync/send.py over cli/sync/sftp.py), small ones in batches through
the node agent (cli/sync/stream.py). The node hashes each part file (a small one as it writes
it), and only a part whose SHA-256 matches the source's is renamed over the final name; a
mismatch is sent again once, then reported. A partly sent file is resumed on the next run after its prefix hash is
checked. Nothing is written outside the destination.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from cli.errors import HrmctlError
from cli.nodes.inventory import Node
from cli.nodes.remote import Session, connect
from cli.sync.lane import HELPER_MIN_BYTES, HelperLane, SharedFiles
from cli.sync.plan import Source, SyncError, Transfer, check_source, make_plan, scan_source
from node.sync_receiver import part_name
from cli.sync.send import Finalizer, NodeAgent, Sender, Sinks
from cli.sync.sftp import WRITE_SIZE, SFTPStalled
from cli.sync.stream import stream_files, streamable

if TYPE_CHECKING:
    from rich.console import Console

SECOND_AGENT_MIN_FILES = 2000  # small files worth more than one node agent (each start costs ~50 ms)
SMALL_FILE_AGENTS = 2  # more did not help on 2 cores (measured: 3 and 4 swung between 0.6 and 1.6 s)
SHARE_FILES = 250  # small files are shared among the agents in runs of at most this many, one directory each

DEFAULT_SRC = "data"


@dataclass
class NodeSync:
    """What happened (or, with dry_run, would happen) on one node."""

    node: str
    dest: str
    ok: bool = True
    error: str | None = None
    exit_code: int = 0
    dry_run: bool = False
    files: int = 0                      # files in the source
    unchanged: int = 0
    sent_files: int = 0
    sent_bytes: int = 0                 # file bytes that went over the wire
    resumed_bytes: int = 0              # bytes of partly sent files that did not have to go again
    resent_files: int = 0               # sent again after a checksum mismatch
    deleted: list[str] = field(default_factory=list)
    to_send: list[str] = field(default_factory=list)
    to_delete: list[str] = field(default_factory=list)
    seconds: float = 0.0                # the whole sync of this node (connect and scan included)
    transfer_seconds: float = 0.0       # sending, verifying and renaming

    @property
    def rate(self) -> float:
        return self.sent_bytes / self.transfer_seconds if self.transfer_seconds > 0 else 0.0


@dataclass
class SyncReport:
    src: str
    nodes: list[NodeSync]
    skipped: list[tuple[str, str]]

    @property
    def ok(self) -> bool:
        return all(n.ok for n in self.nodes)

    def raise_for_errors(self) -> None:
        for n in self.nodes:
            if not n.ok:
                raise SyncError(n.error or f"{n.node}: sync failed", exit_code=n.exit_code or 1)

    def as_dict(self) -> dict[str, Any]:
        return {"src": self.src, "ok": self.ok, "skipped": [list(s) for s in self.skipped],
                "nodes": [dict(asdict(n), rate=round(n.rate)) for n in self.nodes]}


def _human(n: float) -> str:
    from rich.filesize import decimal
    return decimal(int(n))


# ---------------------------------------------------------------- one node

class _NodeSync:
    def __init__(self, session: Session, source_future: Future, result: NodeSync, *, checksum: bool,
                 delete: bool, dry_run: bool, stall_timeout: float, progress: "_Progress",
                 cancel: threading.Event, accept_new_host_keys: bool = False, only: list[str] | None = None):
        self.session, self.source_future, self.r = session, source_future, result
        self.only = only  # scan only these top-level names of the destination (None: all of it)
        self.accept_new_host_keys = accept_new_host_keys
        self.checksum, self.delete, self.dry_run = checksum, delete, dry_run
        self.stall_timeout, self.progress, self.cancel = stall_timeout, progress, cancel
        self.name = session.node.name

    def run(self) -> None:
        self.agent = NodeAgent(self.session, self.stall_timeout)
        try:
            self._run()
        finally:
            self.agent.close()

    def _run(self) -> None:
        job = {"op": "scan", "dest": self.r.dest, "checksum": self.checksum, "dry_run": self.dry_run}
        if self.only is not None:
            job["only"] = self.only
        scan = self.agent.call(job)
        root = scan["root"]
        self.r.dest = root
        source: Source = self.source_future.result()
        if not scan["writable"] and not self.dry_run:
            raise SyncError(f"{self.name}: the destination {root} is not writable by {self.session.node.user}; "
                            "fix its owner/permissions on the node, or pass --dest DIR")
        plan = make_plan(source, scan, checksum=self.checksum, delete=self.delete)
        self.r.files, self.r.unchanged = len(source.files), plan.unchanged
        self.r.to_send = [t.file.rel for t in plan.send]
        self.r.to_delete = list(plan.delete)
        need = plan.bytes_to_send
        if need > scan["free"] and not self.dry_run:
            raise SyncError(f"{self.name}: not enough space for the data in {root}: {_human(need)} to send, "
                            f"{_human(scan['free'])} free; free some space on the node or pass --dest DIR on a "
                            "bigger disk (nothing was changed)")
        if self.dry_run:
            return
        if plan.missing_dirs:
            self.agent.call({"op": "mkdirs", "dest": root, "dirs": plan.missing_dirs})
        self.progress.start(self.name, need)
        t0 = time.monotonic()
        sent = self._transfer(root, plan.send)
        self.r.transfer_seconds = time.monotonic() - t0
        if plan.delete or plan.stale_parts:
            answer = self.agent.call({"op": "finalize", "dest": root, "files": [],
                                              "stale_parts": plan.stale_parts, "delete": plan.delete})
            self.r.deleted = answer["removed"]
        self.r.sent_files = sent

    def _transfer(self, root: str, todo: list[Transfer]) -> int:
        if not todo:
            return 0
        sinks = Sinks(self.session, self.stall_timeout)
        try:
            sent = 0
            for attempt in (1, 2):
                bad = self._round(sinks, root, todo)
                sent += len(todo) - len(bad)
                if not bad:
                    return sent
                if attempt == 1:
                    self.r.resent_files = len(bad)
                    todo = [Transfer(t.file) for t, _ in bad]
                    self.progress.grow(self.name, sum(t.file.size for t in todo))
            t, why = bad[0]
            raise SyncError(f"{self.name}: {t.file.rel} differs on the node after being sent twice ({why}); "
                            "check the node's disk and memory, then run again")
        finally:
            sinks.close()

    def _round(self, sinks: Sinks, root: str, todo: list[Transfer]) -> list[tuple[Transfer, str]]:
        finalizer = Finalizer(self.agent, root)

        count_lock = threading.Lock()

        def on_bytes(n: int) -> None:
            with count_lock:
                self.r.sent_bytes += n
            self.progress.advance(self.name, n)

        sender = Sender(sinks, root, on_bytes, finalizer.add, self.cancel)
        errors: list[BaseException] = []
        # over SSH, small files go through the node agent (cli/sync/stream.py), the rest over SFTP,
        # largest first, shared with a helper process when there is a lot (cli/sync/lane.py)
        small = [t for t in todo if sinks.remote and streamable(t)]
        big = SharedFiles(sorted((t for t in todo if not (sinks.remote and streamable(t))), key=lambda t: -t.file.size))
        if big.items:
            sinks.open_sftp()
        lanes = [lane for lane in (self._helper_lane(big, root, sender, on_bytes, finalizer),) if lane]
        # many small files: more node agents, so the node creates files on more cores; they take a
        # directory (or a run of SHARE_FILES of it) at a time, so they end together and seldom
        # write into the same directory at once
        agents = SMALL_FILE_AGENTS if len(small) >= SECOND_AGENT_MIN_FILES else 1
        runs = SharedFiles(_directory_runs(small))

        def taken() -> Iterator[Transfer]:
            for run in runs:
                yield from run

        def stream(agent: NodeAgent) -> None:
            if runs.items and not sender.stopped:
                stream_files(agent, root, taken(), sender, finalizer, on_bytes)

        def other_agent() -> None:
            agent = NodeAgent(self.session, self.stall_timeout)
            try:
                stream(agent)
            except BaseException as exc:
                errors.append(exc)
                sender.stop.set()
            finally:
                agent.close()

        def worker() -> None:
            try:  # big files first: the files left at the end are small, and finalize quickly
                sender.send_all(big)
                stream(self.agent)
                for lane in lanes:
                    lane.join()
                sender.send_all(big)  # any file the helper gave back
            except BaseException as exc:
                errors.append(exc)
                sender.stop.set()

        lanes += [threading.Thread(target=other_agent, name="sync-stream", daemon=True) for _ in range(agents - 1)]
        threads = [*lanes, threading.Thread(target=worker, name="sync-send", daemon=True)]
        for th in threads:
            th.start()
        self._join(threads, sinks, errors)
        if sinks.sftp is not None and not errors:
            try:
                sinks.sftp.drain()
            except SFTPStalled as exc:
                errors.append(exc)
        if any(isinstance(e, SFTPStalled) for e in errors):
            self.session.close()  # a finalize waiting on a dead link fails at once
        try:
            finalizer.finish()
        except BaseException:
            if not errors:
                raise
        self.r.resumed_bytes += sender.resumed
        if errors:
            self._explain(errors[0], finalizer)
        if sender.failures:
            self._explain_failure(sinks, root, *sender.failures[0])
        if self.cancel.is_set():
            raise SyncError(f"{self.name}: interrupted; partly sent files are kept and the next run resumes them",
                            exit_code=130)
        return finalizer.bad

    def _helper_lane(self, big: SharedFiles, root: str, sender: Sender, on_bytes, finalizer: Finalizer):
        """A thread running a helper process that shares the large files (cli/sync/lane.py), when worth it."""
        todo = list(big.items)
        if not sender.sinks.remote or len(todo) < 2 or sum(t.file.size - t.offset for t in todo) < HELPER_MIN_BYTES:
            return None
        helper = HelperLane(self.session.node, accept_new_host_keys=self.accept_new_host_keys, root=root,
                            stall_timeout=self.stall_timeout)
        sender.lookahead = 2  # leave the next files to whichever lane is free first

        def resumed(n: int) -> None:
            with sender.lock:
                sender.resumed += n

        return threading.Thread(target=helper.run, args=(big,), daemon=True, name="sync-helper", kwargs=dict(
            on_bytes=on_bytes, on_sent=finalizer.add, on_resumed=resumed, stopped=lambda: sender.stopped))

    def _join(self, threads: list[threading.Thread], sinks: Sinks, errors: list[BaseException]) -> None:
        """Wait for the workers; a stalled link (a worker stuck in a send) is cut so they all return."""
        for th in threads:
            while th.is_alive():
                th.join(0.25)
                sftp_stalled = sinks.sftp is not None and sinks.sftp.stalled()
                if (sftp_stalled or self.agent.stalled()) and not errors:
                    errors.append(SFTPStalled(f"no reply from the node for {self.stall_timeout:g}s"))
                    self.session.close()

    def _explain(self, exc: BaseException, finalizer: Finalizer) -> None:
        if isinstance(exc, SFTPStalled):
            raise SyncError(f"{self.name}: the transfer stopped: {exc}; {len(finalizer.done)} files were completed "
                            "and partly sent files are kept: run the same command again to resume") from None
        if isinstance(exc, SyncError):  # already names the node
            raise exc
        if isinstance(exc, (HrmctlError, OSError)):
            raise SyncError(f"{self.name}: {exc}") from None
        raise exc

    def _explain_failure(self, sinks: Sinks, root: str, t: Transfer, why: str, code: int) -> None:
        free = self.agent.call({"op": "space", "dest": root}).get("free", 0)
        if code == 3:
            hint = "permission denied; fix the owner/permissions on the node, or pass --dest DIR"
        elif free < max(WRITE_SIZE, t.file.size - t.offset):
            hint = (f"the node's disk is full ({_human(free)} free in {root}); free some space or pass --dest DIR "
                    "on a bigger disk")
            if sinks.sftp is not None:
                sinks.sftp.remove(f"{root.rstrip('/')}/{part_name(t.file.rel)}")
            elif not sinks.remote:
                Path(root, part_name(t.file.rel)).unlink(missing_ok=True)
        else:
            hint = "see the node's logs"
        raise SyncError(f"{self.name}: {why}: {hint}; completed files are in place and no partial file is under a final name")


def _directory_runs(todo: list[Transfer]) -> list[list[Transfer]]:
    """todo in runs of consecutive files of one directory, at most SHARE_FILES each."""
    runs: list[list[Transfer]] = []
    for t in todo:
        run = runs[-1] if runs else None
        if run and len(run) < SHARE_FILES and os.path.dirname(run[0].file.rel) == os.path.dirname(t.file.rel):
            run.append(t)
        else:
            runs.append([t])
    return runs


# ---------------------------------------------------------------- progress

class OptionalBar:
    """A rich Progress in `self.bar`, or None when no bar is wanted; started and stopped as a context manager."""

    bar: Any = None

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


class _Progress(OptionalBar):
    """One bar per node (bytes, rate, ETA); silent when not wanted."""

    def __init__(self, console: "Console | None", enabled: bool):
        self.tasks: dict[str, Any] = {}
        self.bar = None
        if enabled and console is not None:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=False)

    def start(self, name: str, total: int) -> None:
        if self.bar is not None and total:
            self.tasks[name] = self.bar.add_task(name, total=total)

    def grow(self, name: str, more: int) -> None:
        if name in self.tasks:
            task = self.tasks[name]
            self.bar.update(task, total=self.bar.tasks[task].total + more)

    def advance(self, name: str, n: int) -> None:
        if name in self.tasks:
            self.bar.update(self.tasks[name], advance=n)


# ---------------------------------------------------------------- many nodes

def sync_nodes(nodes: list[Node], src: str | os.PathLike = DEFAULT_SRC, *, dest: str | None = None,
               checksum: bool = False, delete: bool = False, dry_run: bool = False,
               console: "Console | None" = None, progress: bool = True, accept_new_host_keys: bool = False,
               stall_timeout: float = 30.0) -> SyncReport:
    """Sync `src` to every node (in parallel); see the module docstring. Never raises for one node's
    failure: it is in that node's NodeSync (ok, error, exit_code). Bad local input raises SyncError."""
    if not nodes:
        raise SyncError("no nodes to sync; name them with --nodes or in the inventory", exit_code=2)
    check_source(src)
    source_future: Future = Future()
    cancel = threading.Event()
    results = [NodeSync(node=n.name, dest=dest or n.data_path, dry_run=dry_run) for n in nodes]

    def one(node: Node, result: NodeSync) -> None:
        t0 = time.monotonic()
        try:
            with connect(node, accept_new_host_keys=accept_new_host_keys) as session:
                _NodeSync(session, source_future, result, checksum=checksum, delete=delete, dry_run=dry_run,
                          stall_timeout=stall_timeout, progress=bar, cancel=cancel,
                          accept_new_host_keys=accept_new_host_keys).run()
        except HrmctlError as exc:
            result.ok, result.error, result.exit_code = False, str(exc), exc.exit_code
        except Exception as exc:  # one node's surprise must not hide the others' results
            result.ok, result.error, result.exit_code = False, f"{node.name}: {type(exc).__name__}: {exc}", 1
        result.seconds = time.monotonic() - t0

    with _Progress(console, progress and not dry_run) as bar:
        threads = [threading.Thread(target=one, args=(n, r), daemon=True) for n, r in zip(nodes, results)]
        for th in threads:
            th.start()
        try:  # the source is scanned while the nodes connect and scan theirs
            source = scan_source(src, checksum=checksum)
            source_future.set_result(source)
        except BaseException as exc:
            source_future.set_exception(exc)
            cancel.set()
            raise
        try:
            for th in threads:
                while th.is_alive():
                    th.join(0.2)
        except KeyboardInterrupt:
            cancel.set()
            for th in threads:
                th.join(10)
            raise
    return SyncReport(src=str(src), nodes=results, skipped=source.skipped)
