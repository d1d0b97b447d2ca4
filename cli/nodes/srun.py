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
"""

from __future__ import annotations

import os
from typing import Sequence

from cli.nodes.inventory import Node
from cli.nodes.remote import LocalSession


def srun_step(node: Node, argv: Sequence[str]) -> list[str]:
    """argv as one task on `node`, a step of its allocation."""
    return ["srun", f"--jobid={node.slurm_job}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node.name}", "--kill-on-bad-exit=1", "--quiet", *argv]


class SrunSession(LocalSession):
    """Commands on one node of the allocation, each through srun (short ones in place on this process's node)."""

    def __init__(self, node: Node):
        super().__init__(node)
        self.here = node.name == os.environ.get("SLURMD_NODENAME")

    def run(self, argv, *, timeout=60, input=None, env=None, cwd=None):
        return super().run(argv if self.here else srun_step(self.node, argv), timeout=timeout, input=input, env=env,
                           cwd=cwd)

    def start(self, argv, on_line, *, env=None, cwd=None, pty=False):
        return super().start(srun_step(self.node, argv), on_line, env=env, cwd=cwd, pty=pty)

    def pipe(self, argv, *, env=None, cwd=None):
        return super().pipe(argv if self.here else srun_step(self.node, argv), env=env, cwd=cwd)
