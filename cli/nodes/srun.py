"""A node of the Slurm allocation this process runs in, reached with `srun` instead of SSH: the same Session
as cli/nodes/remote.py's, so the launch's preflight, start and stop (cli/launch/) run unchanged on it.

Every command is a job step of one task on that node (`srun --jobid=J --nodes=1 --ntasks=1 --nodelist=NODE`),
`--overlap` so that it runs beside the allocation's other steps (the preflight's probes, the training's own
step, and the stop's), with this process's environment and the given one added (srun's default, --export=ALL),
in the same directory: a cluster's nodes share the file system, so put/get are copies here. The step's standard
input, output and exit code are srun's, so run / run_python / start / pipe are this machine's (LocalSession) with
the srun prefix. Stopping a started command signals srun, which sends the signal on to the task; Slurm itself
watches the node (a node lost fails the step), so no SSH keep-alive is needed.
"""

from __future__ import annotations

from typing import Sequence

from cli.nodes.inventory import Node
from cli.nodes.remote import LocalSession


def srun_step(node: Node, argv: Sequence[str]) -> list[str]:
    """argv as one task on `node`, a step of its allocation."""
    return ["srun", f"--jobid={node.slurm_job}", "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node.name}", "--kill-on-bad-exit=1", "--quiet", *argv]


class SrunSession(LocalSession):
    """Commands on one node of the allocation, each through srun."""

    def run(self, argv, *, timeout=60, input=None, env=None, cwd=None):
        return super().run(srun_step(self.node, argv), timeout=timeout, input=input, env=env, cwd=cwd)

    def _spawn(self, argv, env, cwd, stdin, stderr):
        return super()._spawn(srun_step(self.node, argv), env, cwd, stdin, stderr)
