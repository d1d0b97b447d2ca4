"""A Slurm job's state, and its cancelling, for `hrmctl runs` and `hrmctl stop` (a run submitted with --slurm
records its job id in runs/<run-id>/slurm.json).

The state comes from squeue (pending, running, and a finished job while slurmctld remembers it, MinJobAge), else
`scontrol show job`, else sacct, which needs Slurm's accounting (slurmdbd): without it, a job slurmctld has
forgotten has no state, and the run's own status.json says how it ended."""

from __future__ import annotations

import shutil
import subprocess
import time

from cli.errors import HrmctlError
from cli.slurm.allocation import slurm

ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
         "DEADLINE"}
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED", "RESV_DEL_HOLD"}


def job_state(job_id: str) -> dict | None:
    """{"state": "RUNNING", "reason": ..., "nodes": ..., "source": "squeue"}; None: no Slurm here, or nothing
    remembers the job."""
    if shutil.which("squeue") is None:
        return None
    try:
        return _from_squeue(job_id) or _from_scontrol(job_id) or _from_sacct(job_id)
    except (OSError, subprocess.TimeoutExpired, HrmctlError):
        return None


def _from_squeue(job_id: str) -> dict | None:
    res = slurm(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T|%r|%N"], timeout=15)
    line = res.stdout.strip().splitlines()[:1] if res.returncode == 0 else []
    if not line:
        return None
    state, reason, nodes = (line[0].split("|") + ["", ""])[:3]
    return {"state": state, "reason": "" if reason == "None" else reason, "nodes": nodes, "source": "squeue"}


def _from_scontrol(job_id: str) -> dict | None:
    res = slurm(["scontrol", "show", "job", "-o", job_id], timeout=15)
    fields = dict(f.split("=", 1) for f in res.stdout.split() if "=" in f) if res.returncode == 0 else {}
    if "JobState" not in fields:
        return None
    return {"state": fields["JobState"], "reason": "" if fields.get("Reason") == "None" else fields.get("Reason", ""),
            "nodes": fields.get("NodeList", ""), "source": "scontrol"}


def _from_sacct(job_id: str) -> dict | None:
    if shutil.which("sacct") is None:
        return None
    res = slurm(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,NodeList"], timeout=15)
    line = res.stdout.strip().splitlines()[:1] if res.returncode == 0 else []
    if not line:
        return None
    state, _, nodes = line[0].partition("|")
    return {"state": state.split()[0], "reason": "", "nodes": nodes, "source": "sacct"}


def cancel(job_id: str, wait_s: float = 60.0) -> dict | None:
    """scancel the job, then wait until Slurm says it has ended (its processes are gone from every node: Slurm
    kills what is left KillWait after the SIGTERM); the last state seen."""
    res = slurm(["scancel", job_id], timeout=30)
    if res.returncode != 0:
        lines = (res.stderr or res.stdout).strip().splitlines()
        raise HrmctlError(f"scancel {job_id}: {lines[-1] if lines else f'exit code {res.returncode}'}")
    deadline = time.monotonic() + wait_s
    state = job_state(job_id)
    while state is not None and state["state"] not in ENDED and time.monotonic() < deadline:
        time.sleep(0.5)
        state = job_state(job_id)
    return state
