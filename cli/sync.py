"""`hrmctl sync-data`: make the nodes' dataset match the local one, over SSH, atomically.

For the launcher (`hrmctl train --sync-data`) and other callers:

    report = sync_nodes(nodes, "data", checksum=False, delete=False, dry_run=False, console=console)
    report.raise_for_errors()      # SyncError naming the first node that failed
    report.nodes                   # one NodeSync per node: sent_files, sent_bytes, resumed_bytes, ...

`nodes` are resolved inventory Nodes; each is synced to `dest` or its own `data_path`, all in
parallel. Per node: its manifest is computed by its own Python (cli/sync_remote.py), compared
with the source's (size + mtime, or SHA-256 with checksum=True; cli/sync_plan.py), and only new
or changed files are written, with many SFTP requests in flight (cli/sync_sftp.py), to
`.NAME.hrmctl-part` beside the target. The node then hashes each part file, and only a part
whose SHA-256 matches the source's is renamed over the final name; a mismatch is sent again
once, then reported. A partly sent file is resumed on the next run after its prefix hash is
checked. Nothing is written outside the destination.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import paramiko
from rich.console import Console

from .errors import HrmctlError
from .inventory import Node
from .remote import SSHSession, Session, connect
from .sync_plan import Source, SyncError, Transfer, check_source, make_plan, scan_source
from .sync_remote import BLOCK, part_name
from .sync_sftp import STATUS, WRITE_SIZE, PipelinedSFTP, SFTPError, SFTPStalled

DEFAULT_SRC = "data"
NODE_SNIPPET = Path(__file__).with_name("sync_remote.py").read_text(encoding="utf-8")
BATCH_FILES, BATCH_WAIT_S = 500, 0.02   # how the node's verify-and-rename calls are batched
LOOKAHEAD = 32                  # files whose part file is being opened while earlier files are sent


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


# ---------------------------------------------------------------- the node side, called remotely

class NodeAgent:
    """cli/sync_remote.py running on the node for the whole sync: call(job) -> its JSON answer."""

    def __init__(self, session: Session, stall_timeout: float):
        self.session, self.name, self.stall_timeout = session, session.node.name, stall_timeout
        self.lock = threading.Lock()
        self.pipe = session.pipe([session.node.python, "-S", "-c", NODE_SNIPPET + "\nserve()\n"])

    def call(self, job: dict) -> dict:
        """Send one job and wait for its answer; the node says "." while it works, so a silence
        longer than stall_timeout means the node or the link is gone."""
        with self.lock:
            try:
                self.pipe.send(json.dumps(job) + "\n")
                line = "."
                while line == ".":
                    line = self.pipe.readline(self.stall_timeout)
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise SyncError(f"{self.name}: the connection to the node was lost ({exc})") from None
        if line is None:
            raise SyncError(f"{self.name}: no answer from the node's Python ({self.session.node.python}) within "
                            f"{self.stall_timeout:g}s; check `python` for this node in the inventory, and that "
                            "the node is up; partly sent files are kept for the next run")
        try:
            answer = json.loads(line)
        except ValueError:
            raise SyncError(f"{self.name}: unexpected answer from the node's Python: {line[-200:]!r}") from None
        if not answer.get("ok"):
            raise SyncError(f"{self.name}: {answer.get('error')}")
        return answer

    def close(self) -> None:
        self.pipe.close()


def _human(n: float) -> str:
    from rich.filesize import decimal
    return decimal(int(n))


# ---------------------------------------------------------------- writing files to the node

class _Sinks:
    """Where part files are written: a pipelined SFTP channel, or this machine's filesystem."""

    def __init__(self, session: Session, stall_timeout: float):
        self.sftp = None
        if isinstance(session, SSHSession):
            self.sftp = PipelinedSFTP(session.client.get_transport(), stall_timeout=stall_timeout)

    def close(self) -> None:
        if self.sftp is not None:
            self.sftp.close()


class _Sender:
    """Streams Transfers to part files; calls on_sent(transfer, sha256) once a file is complete."""

    def __init__(self, sinks: _Sinks, root: str, on_bytes: Callable[[int], None],
                 on_sent: Callable[[Transfer, str], None], cancel: threading.Event):
        self.sinks, self.root = sinks, root
        self.on_bytes, self.on_sent = on_bytes, on_sent
        self.cancel = cancel                       # the user's Ctrl-C, for every node
        self.stop = threading.Event()              # this node's own failure
        self.failures: list[tuple[Transfer, str, int]] = []   # (transfer, why, sftp status)
        self.resumed = 0
        self.lock = threading.Lock()

    def remote_part(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{part_name(rel)}"

    def _prefix(self, fh, t: Transfer) -> tuple[Any, int]:
        """The hash so far and where to start: resume only if the node's prefix hash matches ours."""
        h = hashlib.sha256()
        if not t.offset:
            return h, 0
        left = t.offset
        while left:
            chunk = fh.read(min(BLOCK, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
        if left == 0 and h.hexdigest() == t.part_sha256:
            with self.lock:
                self.resumed += t.offset
            return h, t.offset
        fh.seek(0)
        return hashlib.sha256(), 0

    def _fail(self, t: Transfer, why: str, code: int = 0) -> None:
        with self.lock:
            self.failures.append((t, why, code))
        self.stop.set()

    @property
    def stopped(self) -> bool:
        return self.stop.is_set() or self.cancel.is_set()

    def send_all(self, todo: list[Transfer]) -> None:
        """Send every transfer in order; SFTP opens are issued LOOKAHEAD files ahead of the data."""
        ahead: collections.deque[_Opening] = collections.deque()
        it = iter(todo)
        try:
            while not self.stopped:
                while len(ahead) < (LOOKAHEAD if self.sinks.sftp is not None else 1):
                    t = next(it, None)
                    if t is None:
                        break
                    ahead.append(self._open(t))
                if not ahead:
                    return
                opening = ahead.popleft()
                try:
                    if self.sinks.sftp is None:
                        self._send_local(opening)
                    else:
                        self._send_sftp(opening)
                finally:
                    opening.fh.close()
        finally:
            for opening in ahead:
                opening.fh.close()

    def _open(self, t: Transfer) -> "_Opening":
        fh = open(t.file.path, "rb")
        h, offset = self._prefix(fh, t)
        opening = _Opening(t, fh, h, offset)
        if self.sinks.sftp is not None:
            self.sinks.sftp.open_write(self.remote_part(t.file.rel), truncate=offset == 0, callback=opening.opened)
        return opening

    def _send_local(self, o: "_Opening") -> None:
        path = self.remote_part(o.t.file.rel)
        try:
            with open(path, "r+b" if o.offset else "wb") as out:
                out.seek(o.offset)
                while chunk := o.fh.read(WRITE_SIZE):
                    o.h.update(chunk)
                    out.write(chunk)
                    self.on_bytes(len(chunk))
        except OSError as exc:
            self._fail(o.t, f"writing {path} failed: {exc.strerror}", 4)
            return
        self.on_sent(o.t, o.h.hexdigest())

    def _send_sftp(self, o: "_Opening") -> None:
        sftp, path, t = self.sinks.sftp, self.remote_part(o.t.file.rel), o.t
        sftp.wait_until(o.ready)
        if o.error is not None:
            self._fail(t, f"cannot create {path}: {o.error}", o.error.code)
            return
        handle, h = o.handle, o.h
        errors: list[tuple[str, int]] = []

        def wrote(kind: int, code: int, body: bytes, n: int) -> None:
            if kind == STATUS and code == 0:
                self.on_bytes(n)
            elif not errors:
                errors.append((f"writing {path} failed: {SFTPError(code, '')}", code))

        pos, left = o.offset, o.t.file.size - o.offset
        while left > 0 and not self.stopped and not errors:  # the size is known: no read for EOF
            chunk = o.fh.read(min(WRITE_SIZE, left))
            if not chunk:
                break
            left -= len(chunk)
            h.update(chunk)
            n = len(chunk)
            sftp.write(handle, pos, chunk, lambda k, c, b, n=n: wrote(k, c, b, n))
            pos += n
        digest = h.hexdigest()
        complete = not self.stopped

        def closed(kind: int, code: int, body: bytes) -> None:
            if errors:
                self._fail(t, *errors[0])
            elif kind != STATUS or code != 0:
                self._fail(t, f"closing {path} failed: {SFTPError(code, '')}", code)
            elif complete and not self.stopped:
                self.on_sent(t, digest)

        sftp.close_handle(handle, closed)


class _Opening:
    """A file whose part file is being opened on the node (the reply sets handle or error)."""

    def __init__(self, t: Transfer, fh, h, offset: int):
        self.t, self.fh, self.h, self.offset = t, fh, h, offset
        self.handle: bytes | None = None
        self.error: SFTPError | None = None

    def opened(self, handle: bytes | None, error: SFTPError | None) -> None:
        self.handle, self.error = handle, error

    def ready(self) -> bool:
        return self.handle is not None or self.error is not None


class _Finalizer:
    """Batches sent files and has the node verify and rename them, while others are still sent."""

    def __init__(self, agent: NodeAgent, root: str):
        self.agent, self.root = agent, root
        self.queue: queue.Queue = queue.Queue()
        self.done: list[str] = []
        self.bad: list[tuple[Transfer, str]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="sync-finalize", daemon=True)
        self.thread.start()

    def add(self, t: Transfer, digest: str) -> None:
        self.queue.put((t, digest))

    def _loop(self) -> None:
        finished = False
        while not finished:
            batch = [self.queue.get()]
            deadline = time.monotonic() + BATCH_WAIT_S  # small files come fast: gather a few first
            while batch[-1] is not None and len(batch) < BATCH_FILES:
                try:
                    batch.append(self.queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            if batch[-1] is None:
                finished = True
                batch.pop()
            if batch and self.error is None:
                try:
                    self._finalize(batch)
                except BaseException as exc:  # reported by finish()
                    self.error = exc

    def _finalize(self, batch: list[tuple[Transfer, str]]) -> None:
        by_rel = {t.file.rel: t for t, _ in batch}
        job = {"op": "finalize", "dest": self.root,
               "files": [[t.file.rel, t.file.size, t.file.mtime_ns, t.file.mode, d] for t, d in batch]}
        answer = self.agent.call(job)
        self.done.extend(answer["done"])
        self.bad.extend((by_rel[rel], why) for rel, why in answer["bad"])

    def finish(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


# ---------------------------------------------------------------- one node

class _NodeSync:
    def __init__(self, session: Session, source_future: Future, result: NodeSync, *, checksum: bool,
                 delete: bool, dry_run: bool, stall_timeout: float, progress: "_Progress",
                 cancel: threading.Event):
        self.session, self.source_future, self.r = session, source_future, result
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
        scan = self.agent.call({"op": "scan", "dest": self.r.dest, "checksum": self.checksum,
                                "dry_run": self.dry_run})
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
        sinks = _Sinks(self.session, self.stall_timeout)
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

    def _round(self, sinks: _Sinks, root: str, todo: list[Transfer]) -> list[tuple[Transfer, str]]:
        finalizer = _Finalizer(self.agent, root)

        count_lock = threading.Lock()

        def on_bytes(n: int) -> None:
            with count_lock:
                self.r.sent_bytes += n
            self.progress.advance(self.name, n)

        sender = _Sender(sinks, root, on_bytes, finalizer.add, self.cancel)
        errors: list[BaseException] = []

        def worker() -> None:
            try:  # big files first: the files left at the end are small, and finalize quickly
                sender.send_all(sorted(todo, key=lambda t: -t.file.size))
            except BaseException as exc:
                errors.append(exc)
                sender.stop.set()

        threads = [threading.Thread(target=worker, name="sync-send", daemon=True)]
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

    def _join(self, threads: list[threading.Thread], sinks: _Sinks, errors: list[BaseException]) -> None:
        """Wait for the workers; a stalled link (a worker stuck in a send) is cut so they all return."""
        for th in threads:
            while th.is_alive():
                th.join(0.25)
                if sinks.sftp is not None and sinks.sftp.stalled() and not errors:
                    errors.append(SFTPStalled(f"no reply from the node for {self.stall_timeout:g}s"))
                    self.session.close()

    def _explain(self, exc: BaseException, finalizer: _Finalizer) -> None:
        if isinstance(exc, SFTPStalled):
            raise SyncError(f"{self.name}: the transfer stopped: {exc}; {len(finalizer.done)} files were completed "
                            "and partly sent files are kept: run the same command again to resume") from None
        if isinstance(exc, (HrmctlError, OSError)):
            raise SyncError(f"{self.name}: {exc}") from None
        raise exc

    def _explain_failure(self, sinks: _Sinks, root: str, t: Transfer, why: str, code: int) -> None:
        free = self.agent.call({"op": "space", "dest": root}).get("free", 0)
        if code == 3:
            hint = "permission denied; fix the owner/permissions on the node, or pass --dest DIR"
        elif free < max(WRITE_SIZE, t.file.size - t.offset):
            hint = (f"the node's disk is full ({_human(free)} free in {root}); free some space or pass --dest DIR "
                    "on a bigger disk")
            if sinks.sftp is not None:
                sinks.sftp.remove(f"{root.rstrip('/')}/{part_name(t.file.rel)}")
            else:
                Path(root, part_name(t.file.rel)).unlink(missing_ok=True)
        else:
            hint = "see the node's logs"
        raise SyncError(f"{self.name}: {why}: {hint}; completed files are in place and no partial file is under a final name")


# ---------------------------------------------------------------- progress

class _Progress:
    """One bar per node (bytes, rate, ETA); silent when not wanted."""

    def __init__(self, console: Console | None, enabled: bool):
        self.tasks: dict[str, Any] = {}
        self.bar = None
        if enabled and console is not None:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=False)

    def __enter__(self) -> "_Progress":
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()

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
               console: Console | None = None, progress: bool = True, accept_new_host_keys: bool = False,
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
                          stall_timeout=stall_timeout, progress=bar, cancel=cancel).run()
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
