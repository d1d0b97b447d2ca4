"""One channel per node, kept open: the node sampler (node/sampler.py) runs there and prints a line per interval.

`Watch(nodes, interval)` starts a thread per node that connects (cli.nodes.remote.connect: SSH, or a
local process for localhost), starts the agent with the node's Python and reads its lines; the
latest line of every node is in `snapshot()`. A node that cannot be reached, or whose channel drops,
is shown with its error and tried again every RETRY_S. `close()` closes every channel: the agents
see their stdin close and exit.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from cli.errors import HrmctlError
from cli.nodes.inventory import Node
from cli.nodes.remote import CONNECT_TIMEOUT, Pipe, Session, connect
from node.lines import decode
from node.ship import program

RETRY_S = 3.0


@dataclass
class NodeState:
    """What is known of one node: its latest agent line (`data`), when it came, or why there is none."""

    node: Node
    data: dict | None = None
    received: float | None = None  # time.monotonic() of the latest line
    error: str | None = None
    lines: int = 0

    @property
    def name(self) -> str:
        return self.node.name

    def age(self, now: float | None = None) -> float | None:
        return None if self.received is None else (now or time.monotonic()) - self.received

    def copy(self) -> "NodeState":
        return NodeState(self.node, self.data, self.received, self.error, self.lines)


def agent_argv(node: Node, interval: float) -> list[str]:
    return [node.python, "-u", "-c", program("sampler"), "--interval", f"{interval:g}"]


def _ended(pipe: Pipe) -> bool:
    """Whether a pipe whose readline gave None has ended (rather than only being quiet)."""
    chan = getattr(pipe, "chan", None)  # cli.nodes.ssh.SSHPipe
    if chan is not None:
        return bool(chan.closed or chan.eof_received or chan.exit_status_ready())
    proc = getattr(pipe, "proc", None)  # cli.nodes.remote.LocalPipe
    return proc is not None and proc.poll() is not None


@dataclass
class Watch:
    nodes: list[Node]
    interval: float = 1.0
    accept_new_host_keys: bool = False
    connect_timeout: float = CONNECT_TIMEOUT
    states: dict[str, NodeState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.changed = threading.Condition(self.lock)
        self.open: dict[str, tuple[Session, Pipe | None]] = {}
        self.threads: list[threading.Thread] = []
        for node in self.nodes:
            self.states[node.name] = NodeState(node)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "Watch":
        for node in self.nodes:
            t = threading.Thread(target=self._run, args=(node,), name=f"top-{node.name}", daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def close(self) -> None:
        self.stopping.set()
        with self.lock:
            opened = list(self.open.values())
            self.open.clear()
        for session, pipe in opened:
            for thing in (pipe, session):
                try:
                    if thing is not None:
                        thing.close()
                except Exception:
                    pass
        for t in self.threads:
            t.join(2)

    def __enter__(self) -> "Watch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ reading
    def snapshot(self) -> list[NodeState]:
        with self.lock:
            return [self.states[n.name].copy() for n in self.nodes]

    def wait_all(self, timeout: float) -> bool:
        """Until every node has sent a line or failed (True), or timeout (False)."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not all(s.lines or s.error for s in self.states.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
        return True

    def _set(self, name: str, **values) -> None:
        with self.changed:
            state = self.states[name]
            for k, v in values.items():
                setattr(state, k, v)
            self.changed.notify_all()

    def _run(self, node: Node) -> None:
        while not self.stopping.is_set():
            try:
                self._follow(node)
            except HrmctlError as exc:
                self._set(node.name, error=str(exc))
            except Exception as exc:  # a surprise on one node must not stop the others
                self._set(node.name, error=f"{node.name}: {type(exc).__name__}: {exc}")
            finally:
                with self.lock:
                    opened = self.open.pop(node.name, None)
                for thing in (opened or (None, None))[::-1]:
                    try:
                        if thing is not None:
                            thing.close()
                    except Exception:
                        pass
            self.stopping.wait(RETRY_S)

    def _follow(self, node: Node) -> None:
        session = connect(node, accept_new_host_keys=self.accept_new_host_keys, timeout=self.connect_timeout)
        with self.lock:
            if self.stopping.is_set():
                session.close()
                return
            self.open[node.name] = (session, None)
        pipe = session.pipe(agent_argv(node, self.interval))
        with self.lock:
            self.open[node.name] = (session, pipe)
        quiet = max(10.0, 5 * self.interval)  # a live agent prints every interval
        last = time.monotonic()
        while not self.stopping.is_set():
            line = pipe.readline(timeout=min(1.0, self.interval))
            if line is None:
                if self.stopping.is_set():
                    return
                if _ended(pipe):
                    what = "stopped" if self.states[node.name].lines else "did not start"
                    raise HrmctlError(f"{node.name}: the top agent {what} (is python = \"{node.python}\" a Python 3.8+ "
                                      f"on the node? try `hrmctl doctor --nodes {node.name}`)")
                if time.monotonic() - last > quiet:
                    self._set(node.name, error=f"{node.name}: no answer for {time.monotonic() - last:.0f}s")
                continue
            doc = decode(line)
            if doc is None or doc.get("v") != 1:
                continue  # not ours (a login banner printed on stdout, say)
            last = time.monotonic()
            with self.changed:
                state = self.states[node.name]
                state.data, state.received, state.error = doc, last, None
                state.lines += 1
                self.changed.notify_all()
