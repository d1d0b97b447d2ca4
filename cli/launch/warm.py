"""torchrun started on each node of a Slurm allocation while the launch's preflight runs.

torchrun's own start (Python and `import torch`: seconds) does not depend on the plan, and the plan waits for the
preflight (probes, directories, master port: 0.65-1.4 s over srun on the 2-core lab, bench/slurm.py). So on an
allocation's nodes the launch first starts `python -m cli.launch.node_torchrun --held stdin --` on every node
(cli/nodes/srun.py `hold`), and the run's start hands each its torchrun arguments and environment instead of
starting a new step (cli/launch/run.py is unchanged: SrunSession.start passes them on).

A node is held only when its torch facts are cached (a first launch there confirms guessed facts before torchrun:
node_torchrun --expect), and a held process takes only a plain torchrun start in the same directory whose
environment sets nothing that Python reads as it starts (PYTHONPATH for the libuv stand-in, PYTHONHOME, LD_*...);
otherwise it ends and the start is a new step, as without it. A preflight that fails ends every held process with
its session (`close`), before anything trained.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

from cli.launch.facts import CACHE, known, load_cache
from cli.launch.plan import TORCHRUN
from cli.nodes.inventory import Node
from cli.nodes.remote import Session

HELD = ["-m", "cli.launch.node_torchrun", "--held", "stdin", "--"]
READ_AT_START = ("PYTHON", "LD_")  # prefixes of what the interpreter reads before its arguments arrive


def hold_torchrun(sessions: dict[str, Session], nodes: list[Node], run_id: str) -> None:
    """Hold torchrun on every node of an allocation whose facts are cached (SSH and local nodes: nothing read)."""
    allocation = [n for n in nodes if hasattr(sessions[n.name], "hold")]
    cache = load_cache(CACHE) if allocation else {}
    for node in allocation:
        if known(node, cache):
            env = {"HRMCTL_RUN_ID": run_id, "HRMCTL_JOB": f"{run_id}/{node.name}", "PYTHONUNBUFFERED": "1"}
            sessions[node.name].hold([node.python, *HELD], partial(takes, node), env=env, cwd=node.workdir)


def takes(node: Node, argv: Sequence[str], env: dict, cwd: str | None) -> dict | None:
    """What a held torchrun is sent for this start ({"argv", "env"}), or None when it cannot serve it."""
    if list(argv[:3]) != [node.python, *TORCHRUN] or cwd != node.workdir:
        return None
    if any(k.startswith(READ_AT_START) and k != "PYTHONUNBUFFERED" for k in env):
        return None
    return {"argv": list(argv[3:]), "env": dict(env)}
