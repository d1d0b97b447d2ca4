"""Run things on nodes: one interface for this machine and for SSH nodes.

`connect(node)` gives a Session with the same methods either way:
  run(argv)          -> Result (exit code, stdout, stderr), with a timeout
  run_python(code)   -> Result; the snippet goes to the node's Python on stdin
  start(argv)        -> Job whose output arrives line by line; wait / stop
  pipe(argv)         -> Pipe: send lines to its stdin, readline(timeout) from its stdout
  put(local, remote) / get(remote, local) / sftp()
`for_each(nodes, fn)` does the same operation on many nodes in parallel, one Outcome each:
a bad node never hides the others' answers.

SSH itself (paramiko) is cli/nodes/ssh.py, imported only when an SSH node is connected: a launch on this
machine or inside a Slurm allocation does not pay for it. Remote command lines are always built from argv lists
with shlex.quote; an argument that
starts with `~/` is expanded by the node's shell to its home directory, nothing else is.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence, TypeVar

from cli.errors import HrmctlError, RemoteError, RemoteTimeout
from cli.nodes.inventory import Node


CONNECT_TIMEOUT = 10.0

T = TypeVar("T")
LineHandler = Callable[[str, str], None]  # (stream name "stdout"/"stderr", line without newline)


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    def last_line(self) -> str:
        lines = (self.stderr or self.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit code {self.code}"


# ---------------------------------------------------------------- command lines

def quote_arg(arg: str) -> str:
    """shlex.quote, except that a leading `~/` stays expandable by the remote shell."""
    arg = str(arg)
    if arg == "~":
        return '"$HOME"'
    if arg.startswith("~/"):
        rest = arg[2:]
        return '"$HOME"/' + shlex.quote(rest) if rest else '"$HOME"/'
    return shlex.quote(arg)


def command_line(argv: Sequence[str], cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    """One POSIX shell line that runs argv in cwd with env added. Every piece is quoted."""
    if not argv:
        raise ValueError("empty command")
    parts = []
    if cwd:
        parts.append(f"cd {quote_arg(cwd)} &&")
    parts.append("exec")
    if env:
        parts.append("env")
        parts.extend(shlex.quote(f"{k}={v}") for k, v in env.items())
    parts.extend(quote_arg(a) for a in argv)
    return " ".join(parts)


def _expand_local(arg: str) -> str:
    return os.path.expanduser(arg) if arg == "~" or str(arg).startswith("~/") else str(arg)


# ---------------------------------------------------------------- jobs (streamed output)

def _pump_lines(read: Callable[[], bytes], name: str, on_line: LineHandler) -> None:
    """Read chunks until EOF and hand complete lines to on_line (a partial last line too)."""
    buf = b""
    while True:
        chunk = read()
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            on_line(name, line.rstrip(b"\r").decode("utf-8", "replace"))
    if buf:
        on_line(name, buf.rstrip(b"\r").decode("utf-8", "replace"))


class Job:
    """A command started on a node whose output is streamed line by line."""

    def wait(self, timeout: float | None = None) -> int | None:
        """Exit code, or None if still running after `timeout` seconds."""
        raise NotImplementedError

    def stop(self) -> None:
        """Hang up / terminate the command (best effort, never raises)."""
        raise NotImplementedError

    def connection_lost(self) -> bool:
        """Its connection broke before the command's exit status came (wait() then says 255)."""
        return False


class LocalJob(Job):
    def __init__(self, proc: subprocess.Popen, on_line: LineHandler):
        self.proc = proc
        self.threads = [
            threading.Thread(target=_pump_lines, args=(proc.stdout.read1, "stdout", on_line), daemon=True),
            threading.Thread(target=_pump_lines, args=(proc.stderr.read1, "stderr", on_line), daemon=True),
        ]
        for t in self.threads:
            t.start()

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for t in self.threads:
            t.join(5)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except OSError:
                pass


class Pipe:
    """A command on a node with its stdin and stdout connected to us, for line-based exchanges.

    send(data) writes text or bytes to its stdin (over SSH: waiting at most `timeout` seconds, if
    given, for the command to take them); readline(timeout) returns the next stdout line (without the
    newline), or None on timeout or end of output; close() closes its stdin (a well-behaved
    command then exits) and releases the channel.
    """

    def __init__(self) -> None:
        self._buf = b""

    def send(self, data: str | bytes, timeout: float | None = None) -> None:
        raise NotImplementedError

    def _recv(self, timeout: float) -> bytes | None:
        """Some bytes; b"" at end of output; None if nothing arrived within timeout."""
        raise NotImplementedError

    def readline(self, timeout: float | None = 30) -> str | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = 3600.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return None
            chunk = self._recv(left)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.rstrip(b"\r").decode("utf-8", "replace")

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "Pipe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LocalPipe(Pipe):
    def __init__(self, proc: subprocess.Popen):
        super().__init__()
        self.proc = proc

    def send(self, data: str | bytes, timeout: float | None = None) -> None:
        self.proc.stdin.write(data.encode() if isinstance(data, str) else data)
        self.proc.stdin.flush()

    def _recv(self, timeout: float) -> bytes | None:
        import select
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        return os.read(self.proc.stdout.fileno(), 65536)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(2)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        for fh in (self.proc.stdout, self.proc.stderr):
            try:
                if fh is not None:  # stderr is DEVNULL, not a pipe
                    fh.close()
            except OSError:
                pass


# ---------------------------------------------------------------- sessions

class Session:
    """Commands on one node. Use as a context manager; close() releases the connection."""

    node: Node

    def run(self, argv: Sequence[str], *, timeout: float | None = 60, input: str | bytes | None = None,
            env: dict[str, str] | None = None, cwd: str | None = None) -> Result:
        raise NotImplementedError

    def start(self, argv: Sequence[str], on_line: LineHandler, *, env: dict[str, str] | None = None,
              cwd: str | None = None, pty: bool = False) -> Job:
        raise NotImplementedError

    def pipe(self, argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None) -> Pipe:
        """Start argv with its stdin/stdout connected to us (see Pipe); stderr is discarded."""
        raise NotImplementedError

    def put(self, local: str | os.PathLike, remote: str) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: str | os.PathLike) -> None:
        raise NotImplementedError

    def run_python(self, code: str, args: Sequence[str] = (), *, timeout: float | None = 60,
                   env: dict[str, str] | None = None, cwd: str | None = None) -> Result:
        """Run a Python snippet with the node's interpreter, fed through stdin."""
        return self.run([self.node.python, "-", *args], timeout=timeout, input=code, env=env, cwd=cwd)

    def close(self) -> None:
        pass

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LocalSession(Session):
    """This machine, no SSH."""

    def __init__(self, node: Node):
        self.node = node

    def run(self, argv, *, timeout=60, input=None, env=None, cwd=None) -> Result:
        full_env = dict(os.environ, **(env or {}))
        data = input.encode() if isinstance(input, str) else input
        try:
            proc = subprocess.Popen([_expand_local(a) for a in argv], cwd=_expand_local(cwd) if cwd else None,
                                    env=full_env, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            return Result(127, "", f"{argv[0]}: {exc.strerror}")
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RemoteTimeout(f"{self.node.name}: `{shlex.join(argv)}` did not finish in {timeout:g}s; it was stopped")
        return Result(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def _spawn(self, argv, env, cwd, stdin: int, stderr: int) -> subprocess.Popen:
        full_env = dict(os.environ, **(env or {}))
        try:
            return subprocess.Popen([_expand_local(a) for a in argv], cwd=_expand_local(cwd) if cwd else None,
                                    env=full_env, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr,
                                    start_new_session=True)
        except OSError as exc:
            raise RemoteError(f"{self.node.name}: cannot start {argv[0]}: {exc.strerror}") from None

    def start(self, argv, on_line, *, env=None, cwd=None, pty=False) -> Job:
        return LocalJob(self._spawn(argv, env, cwd, subprocess.DEVNULL, subprocess.PIPE), on_line)

    def pipe(self, argv, *, env=None, cwd=None) -> Pipe:
        return LocalPipe(self._spawn(argv, env, cwd, subprocess.PIPE, subprocess.DEVNULL))

    def put(self, local, remote) -> None:
        import shutil
        shutil.copyfile(local, _expand_local(remote))

    def get(self, remote, local) -> None:
        import shutil
        shutil.copyfile(_expand_local(remote), local)


def connect(node: Node, *, accept_new_host_keys: bool = False, timeout: float = CONNECT_TIMEOUT) -> Session:
    """A session on `node`: local for localhost, srun for a node of this Slurm allocation, SSH otherwise. Raises
    RemoteError subclasses."""
    if node.is_local:
        return LocalSession(node)
    if node.slurm_job:
        from cli.nodes.srun import SrunSession
        return SrunSession(node)
    from cli.nodes.ssh import SSHSession  # paramiko (0.2 s to import) only where a node is reached over SSH
    return SSHSession(node, accept_new_host_keys=accept_new_host_keys, timeout=timeout)



def connect_all(nodes: list[Node], accept_new_host_keys: bool) -> dict[str, Session]:
    """A session per node, in parallel; any failure closes the others and raises (nothing started)."""
    sessions: dict[str, Session] = {}
    errors = []

    def one(node: Node):
        try:
            sessions[node.name] = connect(node, accept_new_host_keys=accept_new_host_keys)
        except HrmctlError as exc:
            errors.append(exc)

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        list(pool.map(one, nodes))
    if errors:
        for session in sessions.values():
            session.close()
        raise errors[0]
    return sessions

# ---------------------------------------------------------------- many nodes

@dataclass
class Outcome:
    node: Node
    value: Any = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def for_each(nodes: Iterable[Node], fn: Callable[[Session], T], *, accept_new_host_keys: bool = False,
             connect_timeout: float = CONNECT_TIMEOUT, max_workers: int = 32) -> list[Outcome]:
    """Connect to every node in parallel and call fn(session); one Outcome per node, in order.

    Errors on one node (unreachable, auth, timeout, an exception in fn) are captured in its
    Outcome as one line; they never hide the other nodes' answers.
    """
    nodes = list(nodes)

    def one(node: Node) -> Outcome:
        t0 = time.monotonic()
        try:
            with connect(node, accept_new_host_keys=accept_new_host_keys, timeout=connect_timeout) as session:
                value = fn(session)
            return Outcome(node, value=value, seconds=time.monotonic() - t0)
        except HrmctlError as exc:
            return Outcome(node, error=str(exc), seconds=time.monotonic() - t0)
        except Exception as exc:  # a bug or a surprise on one node must not sink the others
            return Outcome(node, error=f"{node.name}: {type(exc).__name__}: {exc}", seconds=time.monotonic() - t0)

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(max_workers, len(nodes))) as pool:
        return list(pool.map(one, nodes))
