"""A node of the Slurm allocation this process runs in, reached with `srun` instead of SSH: the same Session
as cli/nodes/remote.py's, so the launch's preflight, start and stop (cli/launch/) run unchanged on it.

Every command is a job step of one task on that node (`srun --jobid=J --nodes=1 --ntasks=1 --nodelist=NODE`),
`--overlap` so that it runs beside the allocation's other steps (the preflight's probes, the training's own
step, and the stop's), with this process's environment and the given one added (srun's default, --export=ALL),
in the same directory: a cluster's nodes share the file system, so put/get are copies here. The step's standard
input, output and exit code are srun's, so run / run_python / start / pipe are this machine's (LocalSession) with
the srun prefix. Stopping a started command signals srun, which sends the signal on to the task; Slurm itself
watches the node (a node lost fails the step), so no SSH keep-alive is needed.

On the node this process runs on (the batch script's node, the allocation's first: SLURMD_NODENAME), the
preflight's short commands and its port agent run in place, without a step: a step costs 0.1-0.4 s to start and
the batch job already holds that node. What trains (`start`) is always a step of its own, so that Slurm tracks,
signals and accounts for it as for the other nodes'.

A command may also be started ahead of its arguments (`hold`): a step whose process reads them as one JSON line on
its standard input once they are known, or ends at its end (cli/launch/preflight/prestart.py holds torchrun that way
while the preflight runs). The next `start` that the holder accepts is given to it instead of a new step; `close` ends
one never given. A session made before the launch's (the batch job's first act, cli/slurm/job.py) can `hand_over` what
it holds: the session made for that node later takes it over.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from typing import Callable, Sequence

from cli.nodes.inventory import Node
from cli.nodes.remote import LineHandler, LocalJob, LocalSession

# hold()'s `accepts(argv, env, cwd)`: the arguments to send for a start the held command can serve, else None
Accepts = Callable[[Sequence[str], dict, "str | None"], "dict | None"]


def srun_step(node: Node, argv: Sequence[str]) -> list[str]:
    """argv as one task on `node`, a step of its allocation."""
    return ["srun", f"--jobid={node.slurm_job}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node.name}", "--kill-on-bad-exit=1", "--quiet", *argv]


class Held:
    """A command started before its arguments were known: its lines are kept until a start takes it (`go`)."""

    def __init__(self, proc: subprocess.Popen, accepts: Accepts):
        self.proc, self.accepts = proc, accepts
        self._lock = threading.Lock()
        self._kept: list[tuple[str, str]] = []
        self._on_line: LineHandler | None = None
        self.job = LocalJob(proc, self._line)

    def _line(self, stream: str, line: str) -> None:
        with self._lock:
            if self._on_line is None:
                self._kept.append((stream, line))
                return
        self._on_line(stream, line)

    def go(self, args: dict, on_line: LineHandler) -> LocalJob:
        with self._lock:
            for stream, line in self._kept:
                on_line(stream, line)
            self._kept, self._on_line = [], on_line
        try:
            self.proc.stdin.write((json.dumps(args) + "\n").encode())
            self.proc.stdin.close()
        except OSError:
            pass  # it ended already: wait() says how, its lines said why
        return self.job

    def cancel(self) -> None:
        """End it (never given its arguments): its standard input closed, then srun signalled."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.job.stop()
        if self.job.wait(5) is None:
            self.proc.kill()


_AHEAD: dict[str, Held] = {}  # handed over, by node name, until that node's next session takes it


def hand_over(session: "SrunSession") -> None:
    """What `session` holds goes to the next SrunSession made for its node (the launch's, made later)."""
    if session.held is not None:
        _AHEAD[session.node.name], session.held = session.held, None


class SrunSession(LocalSession):
    """Commands on one node of the allocation, each through srun (short ones in place on this process's node)."""

    def __init__(self, node: Node):
        super().__init__(node)
        self.here = node.name == os.environ.get("SLURMD_NODENAME")
        self.held: Held | None = _AHEAD.pop(node.name, None)

    def hold(self, argv: Sequence[str], accepts: Accepts, *, env=None, cwd=None) -> None:
        """Start argv now as a step whose standard input will carry its arguments (see Held)."""
        proc = self._spawn(srun_step(self.node, argv), env, cwd, subprocess.PIPE, subprocess.PIPE)
        self.held = Held(proc, accepts)

    def run(self, argv, *, timeout=60, input=None, env=None, cwd=None):
        return super().run(argv if self.here else srun_step(self.node, argv), timeout=timeout, input=input, env=env,
                           cwd=cwd)

    def start(self, argv, on_line, *, env=None, cwd=None, pty=False):
        args = self.held.accepts(argv, env or {}, cwd) if self.held else None
        if args is not None:
            held, self.held = self.held, None
            return held.go(args, on_line)
        return super().start(srun_step(self.node, argv), on_line, env=env, cwd=cwd, pty=pty)

    def close(self) -> None:
        if self.held:
            held, self.held = self.held, None
            held.cancel()

    def pipe(self, argv, *, env=None, cwd=None):
        return super().pipe(argv if self.here else srun_step(self.node, argv), env=env, cwd=cwd)
