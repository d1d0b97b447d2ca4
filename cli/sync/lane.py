"""A second connection, in a second process, for the large files of `hrmctl sync-data`.

One paramiko connection carries about 230 MB/s on a fast link: each 32 KB SSH packet costs some
Python (framing, padding, encryption, the system call), and one process's Python runs on one core
at a time. When a node gets several large files, a helper process (`python -m cli.sync.lane`)
opens a connection of its own and sends some of them with the same Sender over its own
pipelined SFTP channel. Both lanes take the next file from one shared list, so the faster one
sends more. The helper reports progress and each sent file's SHA-256 on its stdout; this
process's node agent verifies and renames those files like every other one.

The helper only adds speed: if it cannot start, stalls, or fails on a file, that file goes back
to the list and this process's own lane sends it (and reports any real error, such as a full disk).
It reads its jobs on stdin and stops when stdin closes (Ctrl-C, or the end of the sync).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Callable

from cli.sync.plan import SourceFile, Transfer

HELPER_MIN_BYTES = 64 << 20   # large files worth a second connection (its start costs ~0.3 s of CPU)
PROGRESS_EVERY = 4 << 20      # the helper reports sent bytes in steps of this much, or every second


class SharedFiles:
    """The large files still to send, taken in order by every lane (thread-safe)."""

    def __init__(self, todo: list[Transfer]):
        self.items, self.lock = collections.deque(todo), threading.Lock()

    def __iter__(self) -> "SharedFiles":
        return self

    def __next__(self) -> Transfer:
        with self.lock:
            if not self.items:
                raise StopIteration
            return self.items.popleft()

    def put_back(self, t: Transfer) -> None:
        with self.lock:
            self.items.appendleft(t)


def _transfer_json(t: Transfer) -> dict:
    return {"file": dataclasses.asdict(t.file), "offset": t.offset, "part_sha256": t.part_sha256}


# ---------------------------------------------------------------- this process's side


class HelperLane:
    """A helper process with its own connection to the node; run() sends files until none are left."""

    command = [sys.executable, "-m", "cli.sync.lane"]

    def __init__(self, node, *, accept_new_host_keys: bool, root: str, stall_timeout: float):
        self.stall_timeout = stall_timeout
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.setup = {"node": dataclasses.asdict(node), "accept_new_host_keys": accept_new_host_keys, "root": root,
                      "stall_timeout": stall_timeout}
        self.buf = b""

    def _write(self, msg: dict) -> None:
        self.proc.stdin.write(json.dumps(msg).encode() + b"\n")
        self.proc.stdin.flush()

    def _read(self) -> dict | None:
        """The helper's next message, or None if it said nothing for stall_timeout or ended."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            ready, _, _ = select.select([fd], [], [], self.stall_timeout)
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return None

    def run(self, files: SharedFiles, *, on_bytes: Callable[[int], None], on_sent: Callable[[Transfer, str], None],
            on_resumed: Callable[[int], None], stopped: Callable[[], bool]) -> None:
        """Send files from the shared list until it is empty, the sync stops, or the helper fails."""
        try:
            try:
                self._write(self.setup)
            except OSError:  # it ended at once
                return
            hello = self._read()
            if not hello or not hello.get("ready"):  # it could not connect: our own lane sends everything
                return
            while not stopped():
                t = next(files, None)
                if t is None:
                    return
                try:
                    self._write({"send": _transfer_json(t)})
                except OSError:  # the helper is gone
                    files.put_back(t)
                    return
                while True:
                    msg = self._read()
                    if msg is None or "failed" in msg:  # the helper is gone or stuck: our own lane sends
                        self.close()                     # the file, once the helper cannot write it any more
                        files.put_back(t)
                        return
                    if "bytes" in msg:
                        on_bytes(msg["bytes"])
                    if "resumed" in msg:
                        on_resumed(msg["resumed"])
                    if "sent" in msg:
                        on_sent(t, msg["sha256"])
                        break
        finally:
            self.close()

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the helper stops at the end of its current chunk
        except OSError:
            pass
        try:
            self.proc.wait(self.stall_timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# ---------------------------------------------------------------- the helper process


def main() -> int:
    from cli.nodes.inventory import Node
    from cli.nodes.remote import connect
    from cli.sync.send import Sender, Sinks

    out_lock = threading.Lock()

    def emit(msg: dict) -> None:
        with out_lock:
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()

    jobs: collections.deque = collections.deque()
    job_ready, cancel = threading.Condition(), threading.Event()

    def read_jobs() -> None:  # stdin closed: the sync is over or interrupted; stop sending
        for line in sys.stdin:
            with job_ready:
                jobs.append(json.loads(line))
                job_ready.notify()
        cancel.set()
        with job_ready:
            job_ready.notify()

    setup = json.loads(sys.stdin.readline())
    threading.Thread(target=read_jobs, daemon=True).start()
    with connect(Node(**setup["node"]), accept_new_host_keys=setup["accept_new_host_keys"]) as session:
        sinks = Sinks(session, setup["stall_timeout"])
        sinks.open_sftp()
        emit({"ready": True})
        pending = [0]

        last = [time.monotonic()]

        def on_bytes(n: int) -> None:  # from the SFTP reader thread
            with out_lock:
                pending[0] += n
                if pending[0] < PROGRESS_EVERY and time.monotonic() - last[0] < 1.0:
                    return
                n, pending[0], last[0] = pending[0], 0, time.monotonic()
            emit({"bytes": n})

        sent: dict[str, str] = {}
        sender = Sender(sinks, setup["root"], on_bytes, lambda t, digest: sent.__setitem__(t.file.rel, digest), cancel)
        while not cancel.is_set():
            with job_ready:
                while not jobs and not cancel.is_set():
                    job_ready.wait()
                if cancel.is_set():
                    break
                job = jobs.popleft()["send"]
            t = Transfer(SourceFile(**job["file"]), job["offset"], job["part_sha256"])
            resumed = sender.resumed
            sender.send_all([t])
            sinks.sftp.drain()
            if sender.failures or t.file.rel not in sent:
                emit({"failed": t.file.rel})
                break
            with out_lock:
                n, pending[0] = pending[0], 0
            emit({"bytes": n, "resumed": sender.resumed - resumed, "sent": t.file.rel, "sha256": sent.pop(t.file.rel)})
        sinks.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the Ctrl-C is the parent's to report
        sys.exit(130)
    except Exception:  # any trouble: the parent's own lane sends the file
        sys.exit(1)
