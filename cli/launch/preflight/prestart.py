"""torchrun started on each node of a Slurm allocation while the launch's preflight runs.

torchrun's own start (Python and `import torch`: seconds) does not depend on the plan, and the plan waits for the
preflight (probes, directories, master port: 0.65-1.4 s over srun on the 2-core lab, bench/slurm.py). So on an
allocation's nodes the launch first starts `python -m node torchrun --held stdin --` on every node
(cli/nodes/srun.py `hold`), and the run's start hands each its torchrun arguments and environment instead of
starting a new step (cli/launch/run/attempt.py is unchanged: SrunSession.start passes them on).

A first launch on a node (its torch facts not cached: each new allocation's nodes on a large cluster) is held too:
its start is node/torchrun.py's, and the held process is sent node/torchrun.py's own options with torchrun's arguments,
so it confirms the guessed facts (--expect) with the torch it has imported before torchrun runs, as a new step
would. A held process takes only a start in the same directory whose environment sets nothing that Python reads
as it starts (PYTHONPATH for the libuv stand-in, PYTHONHOME, LD_*...); otherwise it ends and the start is a new
step, as without it. A preflight that fails ends every held process with its session (`close`), before anything
trained. A batch job holds torchrun first of all (`hold_ahead`, cli/slurm/job.py: before its imports and the
command's checks), and the launch's sessions take those over.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

from cli.launch.plan.plan import CHECKED_TORCHRUN, TORCHRUN
from cli.nodes.inventory import Node
from cli.nodes.remote import Session
from node.torchrun import options

HELD = [*CHECKED_TORCHRUN, "--held", "stdin", "--"]
READ_AT_START = ("PYTHON", "LD_")  # prefixes of what the interpreter reads before its arguments arrive


def hold_torchrun(sessions: dict[str, Session], nodes: list[Node], run_id: str) -> None:
    """Hold torchrun on every node of an allocation (SSH and local nodes: nothing; a node held ahead: kept)."""
    for node in nodes:
        session = sessions[node.name]
        if hasattr(session, "hold") and session.held is None:
            env = {"HRMCTL_RUN_ID": run_id, "HRMCTL_JOB": f"{run_id}/{node.name}", "PYTHONUNBUFFERED": "1"}
            session.hold([node.python, *HELD], partial(takes, node), env=env, cwd=node.workdir)


def hold_ahead(nodes: list[Node], run_id: str) -> None:
    """Hold torchrun on every node of the allocation before the launch's sessions exist (they take it over)."""
    from cli.nodes.srun import SrunSession, hand_over

    sessions = {node.name: SrunSession(node) for node in nodes}
    hold_torchrun(sessions, nodes, run_id)
    for session in sessions.values():
        hand_over(session)


def takes(node: Node, argv: Sequence[str], env: dict, cwd: str | None) -> dict | None:
    """What a held torchrun is sent for this start ({"argv", "env"}, and node/torchrun.py's own options as "own"), or
    None when it cannot serve it."""
    if list(argv[:1]) != [node.python] or cwd != node.workdir:
        return None
    if any(k.startswith(READ_AT_START) and k != "PYTHONUNBUFFERED" for k in env):
        return None
    if list(argv[1:3]) == TORCHRUN:
        return {"argv": list(argv[3:]), "env": dict(env)}
    at = 1 + len(CHECKED_TORCHRUN)
    parsed = options(list(argv[at:])) if list(argv[1:at]) == CHECKED_TORCHRUN else None
    if parsed is None or "--held" in parsed[0]:
        return None
    return {"argv": parsed[1], "env": dict(env), "own": parsed[0]}
