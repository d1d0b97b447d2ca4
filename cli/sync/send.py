"""Writing files to a node for `hrmctl sync-data`: the node agent, the sender, the finalizer.

NodeAgent   node/sync_receiver.py running on the node for a whole sync (scan, mkdirs, finalize, and
            put: small files, see cli/sync/stream.py).
Sender      streams files to `.NAME.hrmctl-part` over pipelined SFTP (or to a local directory),
            opening the next files' part files while earlier files are still being sent.
Finalizer   batches the files that are complete and has the node verify and rename them,
            while other files are still being sent.
"""

from __future__ import annotations

import collections
import hashlib
import json
import queue
import threading
import time
from typing import Any, Callable, Iterable, Iterator

import paramiko

from cli.nodes.remote import Session
from cli.nodes.ssh import SSHSession
from cli.sync.plan import SyncError, Transfer
from cli.sync.sftp import STATUS, WRITE_SIZE, PipelinedSFTP, SFTPError
from node.lines import decode
from node.ship import program
from node.sync_receiver import BLOCK, part_name

BATCH_FILES, BATCH_WAIT_S = 500, 0.02   # how the node's verify-and-rename calls are batched
SEND_PIECE = 256 * 1024         # a batch goes to the agent in pieces: each one taken is progress
ALIVE = {"alive": True}          # the node is still at work (node/sync_receiver.py serve)
LOOKAHEAD = 32                  # files whose part file is being opened while earlier files are sent


class NodeAgent:
    """node/sync_receiver.py running on the node for the whole sync: call(job) -> its JSON answer."""

    def __init__(self, session: Session, stall_timeout: float):
        self.session, self.name, self.stall_timeout = session, session.node.name, stall_timeout
        self.lock = threading.Lock()
        self.answered = False  # once it has answered, a silence means a lost link, not a bad python
        self.waiting, self.progress = False, time.monotonic()   # see stalled()
        self.pipe = session.pipe([session.node.python, "-S", "-c", program("sync_receiver")])

    def call(self, job: dict) -> dict:
        """Send one job and wait for its answer; the node says {"alive": true} while it works, so a silence
        longer than stall_timeout means the node or the link is gone."""
        with self.lock:
            self._send(json.dumps(job).encode() + b"\n")
            return self._answer()

    def call_many(self, jobs: Iterator[tuple[dict, bytes]], on_answer: Callable[[dict], bool], depth: int = 2) -> None:
        """Jobs whose payload follows their line (put), up to `depth` in flight: the node works on
        one while the next is on its way. on_answer(answer) False: send no more; the answers of
        jobs already sent are still read (and given to on_answer), so the agent stays usable."""
        with self.lock:
            pending, more = 0, True
            while True:
                while more and pending < depth:
                    item = next(jobs, None)
                    if item is None:
                        more = False
                        break
                    job, payload = item
                    self._send(json.dumps(job).encode() + b"\n" + payload)
                    pending += 1
                if not pending:
                    return
                answer = self._answer()
                pending -= 1
                if not on_answer(answer):
                    more = False

    def stalled(self) -> bool:
        """True when a call has waited stall_timeout for the node to take or answer anything (a
        send stuck on a dead TCP link does not time out by itself: the caller closes the session)."""
        return self.waiting and time.monotonic() - self.progress > self.stall_timeout

    def _send(self, data: bytes) -> None:
        self.waiting, self.progress = True, time.monotonic()
        try:
            view = memoryview(data)
            for start in range(0, len(data), SEND_PIECE):
                self.pipe.send(view[start:start + SEND_PIECE].tobytes(), timeout=self.stall_timeout)
                self.progress = time.monotonic()
        except TimeoutError:
            raise SyncError(f"{self.name}: the transfer stopped: the node took nothing for {self.stall_timeout:g}s; "
                            "completed files are in place: run the same command again") from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._lost(exc) from None
        finally:
            self.waiting = False

    def _lost(self, exc: BaseException) -> SyncError:
        """The channel closed under a send or a read: before the node's Python ever answered, it did not start
        there (a wrong `python`: the command ends at once, and its channel with it, often before the first job is
        sent); after, the link or the node went away."""
        why = str(exc) or type(exc).__name__
        if not self.answered:
            return SyncError(f"{self.name}: the node's Python ({self.session.node.python}) ended without an answer "
                             f"({why}); check `python` for this node in the inventory, and that the node is up")
        return SyncError(f"{self.name}: the connection to the node was lost ({why})")

    def _answer(self) -> dict:
        self.waiting, self.progress = True, time.monotonic()
        try:
            line, answer = None, ALIVE
            while answer == ALIVE:  # the node's heartbeat while it works
                line = self.pipe.readline(self.stall_timeout)
                answer = None if line is None else decode(line)
                self.progress = time.monotonic()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._lost(exc) from None
        finally:
            self.waiting = False
        if line is None and self.answered:  # it was up: the link (or the node) went away since
            raise SyncError(f"{self.name}: the transfer stopped: no reply from the node for {self.stall_timeout:g}s; "
                            "completed files are in place and partly sent files are kept: run the same command "
                            "again to resume")
        if line is None:
            raise SyncError(f"{self.name}: no answer from the node's Python ({self.session.node.python}) within "
                            f"{self.stall_timeout:g}s; check `python` for this node in the inventory, and that "
                            "the node is up; partly sent files are kept for the next run")
        if answer is None:
            raise SyncError(f"{self.name}: unexpected answer from the node's Python: {line[-200:]!r}")
        self.answered = True
        if not answer.get("ok"):
            raise SyncError(f"{self.name}: {answer.get('error')}")
        return answer

    def close(self) -> None:
        self.pipe.close()


class Sinks:
    """Where part files are written: a pipelined SFTP channel (opened when first needed), or this
    machine's filesystem (a local node)."""

    def __init__(self, session: Session, stall_timeout: float):
        self.session, self.stall_timeout = session, stall_timeout
        self.remote = isinstance(session, SSHSession)
        self.sftp: PipelinedSFTP | None = None

    def open_sftp(self) -> None:
        if not self.remote or self.sftp is not None:
            return
        session = self.session
        try:
            self.sftp = PipelinedSFTP(session.client.get_transport(), stall_timeout=self.stall_timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SyncError(f"{session.node.name}: cannot start SFTP on the node ({exc or type(exc).__name__}); "
                            "its sshd_config needs a `Subsystem sftp` line (internal-sftp or sftp-server)") from None

    def close(self) -> None:
        if self.sftp is not None:
            self.sftp.close()


class Sender:
    """Streams Transfers to part files; calls on_sent(transfer, sha256) once a file is complete."""

    def __init__(self, sinks: Sinks, root: str, on_bytes: Callable[[int], None],
                 on_sent: Callable[[Transfer, str], None], cancel: threading.Event, lookahead: int = LOOKAHEAD):
        self.sinks, self.root, self.lookahead = sinks, root, lookahead
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

    def fail(self, t: Transfer, why: str, code: int = 0) -> None:
        with self.lock:
            self.failures.append((t, why, code))
        self.stop.set()

    @property
    def stopped(self) -> bool:
        return self.stop.is_set() or self.cancel.is_set()

    def send_all(self, todo: Iterable[Transfer]) -> None:
        """Send every transfer in order; SFTP opens are issued `lookahead` files ahead of the data."""
        ahead: collections.deque[_Opening] = collections.deque()
        it = iter(todo)
        try:
            while not self.stopped:
                while len(ahead) < (self.lookahead if self.sinks.remote else 1):
                    t = next(it, None)
                    if t is None:
                        break
                    ahead.append(self._open(t))
                if not ahead:
                    return
                opening = ahead.popleft()
                try:
                    if not self.sinks.remote:
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
            self.fail(o.t, f"writing {path} failed: {exc.strerror}", 4)
            return
        self.on_sent(o.t, o.h.hexdigest())

    def _send_sftp(self, o: "_Opening") -> None:
        sftp, path, t = self.sinks.sftp, self.remote_part(o.t.file.rel), o.t
        sftp.wait_until(o.ready)
        if o.error is not None:
            self.fail(t, f"cannot create {path}: {o.error}", o.error.code)
            return
        handle, h = o.handle, o.h
        errors: list[tuple[str, int]] = []

        def wrote(kind: int, code: int, body: bytes, n: int) -> None:
            if kind == STATUS and code == 0:
                self.on_bytes(n)
            elif not errors:
                errors.append((f"writing {path} failed: {SFTPError(code, '')}", code))

        pos = o.offset
        chunks = ReadAhead(o.fh, h, o.t.file.size - o.offset, WRITE_SIZE)
        try:
            for chunk in chunks:
                if self.stopped or errors:
                    break
                n = len(chunk)
                sftp.write(handle, pos, chunk, lambda k, c, b, n=n: wrote(k, c, b, n))
                pos += n
        finally:
            chunks.close()
        digest = h.hexdigest()
        complete = not self.stopped

        def closed(kind: int, code: int, body: bytes) -> None:
            if errors:
                self.fail(t, *errors[0])
            elif kind != STATUS or code != 0:
                self.fail(t, f"closing {path} failed: {SFTPError(code, '')}", code)
            elif complete and not self.stopped:
                self.on_sent(t, digest)

        sftp.close_handle(handle, closed)


class ReadAhead:
    """The chunks of a file, read and hashed by a thread of their own a few chunks ahead.

    Reading and SHA-256 (which lets go of the GIL) then run beside the sending thread, whose
    encryption and system calls are the slowest part of a large transfer; the hash ``h`` is
    complete when iteration ends. The size is known, so no read waits for the end of the file.
    """

    def __init__(self, fh, h, size: int, chunk: int, depth: int = 8):
        self.fh, self.h, self.left, self.chunk = fh, h, size, chunk
        self.queue: queue.Queue = queue.Queue(depth)
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._read, name="sync-read", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while self.left > 0 and not self.closed.is_set():
                data = self.fh.read(min(self.chunk, self.left))
                if not data:
                    break
                self.h.update(data)
                self.left -= len(data)
                self._put(data)
        except OSError as exc:
            self._put(exc)
        self._put(None)

    def _put(self, item) -> None:
        while not self.closed.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self):
        while (item := self.queue.get()) is not None:
            if isinstance(item, OSError):
                raise item
            yield item

    def close(self) -> None:
        """Stop reading (early, on a failure) and wait for the reader: ``h`` and the file are then ours again."""
        self.closed.set()
        self.thread.join()


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


class Finalizer:
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
