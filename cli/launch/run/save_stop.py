"""A stop that saves first. On SIGUSR1 (Slurm's warning before a job's time limit, sent to hrmctl as the batch
shell; or a user's), and on SIGTERM inside a Slurm job (scancel, scontrol requeue, preemption), the launcher lets
the ranks write a checkpoint before it stops the job:

  - SIGUSR1: sent on to every rank on every node (the children of the job's torchrun agent, the process tagged with
    this job's HRMCTL_JOB that runs torchrun: a rank forked from it (lab/forked_ranks.py, the suite's) shows the agent's
    environment in /proc, not its LOCAL_RANK; the agent itself would die of the signal); under Slurm's SIGTERM Slurm has
    signalled every process of the job itself, and a new job step could not start anyway;
  - the ranks agree on a step, save there and end with exit 0 (auralm/training/stop_request.py);
  - up to SAVE_GRACE_S for every node's job to end by itself, its lines still shown; then the usual stop
    (cli/launch/run/attempt.py) for whatever is left.

Imports cli.nodes.remote only.
"""

from __future__ import annotations

import signal
import time
from typing import Callable

from cli.nodes.remote import for_each
from node.lines import last
from node.ship import program

SAVE_GRACE_S = 60.0  # within Slurm's signal lead (cli/slurm/submit.py SIGNAL_S) and a usual KillWait's 30 s...
SLURM_TERM_GRACE_S = 25.0  # ...minus a margin: under scancel, Slurm kills what is left KillWait after its SIGTERM
POLL_S = 0.1

def saves_first(signum: int | None, plans) -> bool:
    """Whether a stop on ``signum`` lets the ranks save first."""
    in_slurm = any(p.node.reached_by == "srun" for p in plans)
    return signum == signal.SIGUSR1 or (signum == signal.SIGTERM and in_slurm)


def save_then_wait(signum: int, plans, jobs: dict, log, accept_new_host_keys: bool,
                   saved: Callable[[], bool] | None = None) -> bool:
    """Ask every rank for a checkpoint and wait for every node's job to end; whether all ended in time. With
    ``saved`` (rank 0 said the checkpoint is written), the wait ends there too, and what is left of each job's end
    is not waited for (the caller stops it): torchrun's exit barrier, say, which waits 10 s for the agent of a node
    that left a DiLoCo run."""
    grace = SAVE_GRACE_S if signum == signal.SIGUSR1 else SLURM_TERM_GRACE_S
    name = signal.Signals(signum).name
    log.note(f"{name}: every rank saves a checkpoint at a step they agree on, then stops (up to {grace:.0f}s)")
    if signum == signal.SIGUSR1:
        by_name = {p.node.name: p for p in plans}

        def send(session) -> int:
            res = session.run_python(program("jobs"), ["ranks", by_name[session.node.name].env["HRMCTL_JOB"]],
                                     timeout=20)
            n = (last(res.stdout) or {}).get("signalled") if res.ok else None
            return n if isinstance(n, int) else 0

        reached = sum(o.value for o in for_each([p.node for p in plans], send,
                                                accept_new_host_keys=accept_new_host_keys, connect_timeout=4) if o.ok)
        if not reached:
            log.note(f"{name}: no rank was found to save; stopping")
            return False
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if all(job.wait(0) is not None for job in jobs.values()) or (saved is not None and saved()):
            return True
        time.sleep(POLL_S)
    log.note(f"{name}: the ranks did not end within {grace:.0f}s of the request; stopping them")
    return False
