"""runs/<run-id>/status.json, for `hrmctl runs`: written when the job starts, at rank 0's first step, at each leave
and join of a node, and at the end (the format is in docs/runs.md; cli/runs/catalog.py reads it)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from cli.launch.plan.plan import LaunchPlan, NodeLaunch
from cli.launch.run.attempt import RunResult
from cli.runs.states import RunState

STATUS_FILE = "status.json"  # read by cli/runs/catalog.py; the format is in docs/runs.md


def _write_status(run_dir: Path, doc: dict) -> None:
    tmp = run_dir / f".{STATUS_FILE}.{threading.get_ident()}.tmp"  # one per thread: first_step is a reader's
    tmp.write_text(json.dumps(dict(doc), indent=2) + "\n")  # a copy: another thread may add a key meanwhile
    os.replace(tmp, run_dir / STATUS_FILE)  # a reader sees the old document or the new one, never half of one


def members_changed(run_dir: Path, doc: dict, events: list[dict]) -> None:
    """status.json with the run's leaves and joins so far (training.elastic: `hrmctl runs --json`'s "members")."""
    doc["members"] = list(events)
    try:
        _write_status(run_dir, doc)
    except OSError:
        pass


def _trainer_dir(plan: NodeLaunch) -> str | None:
    """Where rank 0 writes config.json and metrics.jsonl (its out_dir), when that is on this machine."""
    if plan.node.reached_by == "ssh":  # a Slurm node shares this machine's files (the cluster's file system)
        return None
    out = None
    for a in plan.argv[plan.argv.index("-m", 2) + 2:] if "-m" in plan.argv[2:] else []:
        key, _, value = a.partition("=")
        if key in ("out_dir", "checkpoint_path") and value:
            out = value
        elif key == "run_name" and value and out is None:
            out = f"runs/{value}"
    return str((Path(plan.cwd).expanduser() / out).resolve()) if out else None


def started(run_dir: Path, prep: LaunchPlan) -> dict:
    """status.json at the start: running, and who runs it (this process, on this host), so that a reader can tell a
    live run from one whose launcher was killed before it could write the end."""
    import psutil

    doc = {"run_id": prep.run_id, "state": RunState.RUNNING, "started": round(time.time(), 3),
           "host": socket.gethostname(), "pid": os.getpid(), "pid_started": psutil.Process().create_time(),
           "module": prep.options.module, "nodes": [p.node.name for p in prep.plans],
           "world": sum(p.nproc for p in prep.plans), "backend": prep.backend,
           "trainer_dir": _trainer_dir(prep.plans[0]), "detached": prep.options.detached}
    if prep.plans[0].node.slurm_job:  # inside a Slurm allocation: `hrmctl runs` and `stop` ask Slurm about it
        doc["slurm_job"] = prep.plans[0].node.slurm_job
    try:
        _write_status(run_dir, doc)
    except OSError:
        pass  # the run itself matters more than its record
    return doc


def first_step(run_dir: Path, doc: dict) -> None:
    """status.json once rank 0's first step is logged (`hrmctl train --detach` returns then:
    cli/launch/supervise/detach.py)."""
    doc["first_step"] = round(time.time(), 3)
    try:
        _write_status(run_dir, doc)
    except OSError:
        pass


def ended(run_dir: Path, doc: dict, result: RunResult | None, attempts: int, error: BaseException | None) -> None:
    """status.json at the end: finished (every node exited 0), stopped (Ctrl-C, SIGTERM, SIGHUP) or failed."""
    if isinstance(error, KeyboardInterrupt):
        doc.update(state=RunState.STOPPED, exit_code=130, reason="interrupted (Ctrl-C)")
    elif error is not None or result is None:
        doc.update(state=RunState.FAILED, exit_code=None, reason=f"hrmctl failed: {type(error).__name__}: {error}"
                   if error is not None else "hrmctl ended without a result")
    else:
        state = RunState.FINISHED if result.code == 0 else RunState.STOPPED if result.interrupted else RunState.FAILED
        doc.update(state=state, exit_code=result.code, reason=result.reason, failed_node=result.failed_node,
                   failed_rank=result.failed_rank, left_running=result.left_running)
        if result.code and not result.interrupted and result.no_restart:
            doc.update(no_restart=result.no_restart)
    doc.update(ended=round(time.time(), 3), attempts=attempts)
    try:
        _write_status(run_dir, doc)
    except OSError:
        pass
