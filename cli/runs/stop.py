"""`hrmctl stop RUN`: a run stopped from any terminal. A run submitted with --slurm is cancelled (scancel) and
waited for until Slurm says its job has ended: Slurm has then killed what was left of it on every node. Any other
run whose hrmctl runs on this machine (inside salloc too) gets SIGTERM, as `kill` would: that hrmctl stops the job
on every node (cli/launch/run.py) and records the run as stopped. A run launched inside an allocation from another
host (salloc's shell on a compute node) is cancelled with its allocation."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from cli.errors import HrmctlError
from cli.runs.catalog import SLURM_FILE, STATUS_FILE, _json, launcher_alive, load_run, slurm_job_of

WAIT_S = 60.0


def stop_run(path: Path, *, as_json: bool) -> int:
    run = load_run(path)
    doc = _json(path / STATUS_FILE)
    submitted = _json(path / SLURM_FILE)
    if run.status == "running" and launcher_alive(doc) and not submitted:
        return _terminate(run.id, doc, as_json)  # its hrmctl, here: it stops every node (inside salloc too)
    job = slurm_job_of(doc, submitted)
    if job and run.status in ("queued", "running"):
        from cli.slurm.jobs import ENDED, cancel

        state = cancel(str(job), WAIT_S)
        ended = state is None or state["state"] in ENDED
        what = f"Slurm job {job} {state['state'] if state else 'gone'}"
        return _said(run.id, what if ended else f"{what}: still not ended after {WAIT_S:.0f}s", ended, as_json)
    if run.status == "running":
        raise HrmctlError(f"run {run.id} runs from {doc.get('host')}, not this machine: stop it there "
                          f"(`hrmctl stop {run.id}` on {doc.get('host')}, or Ctrl-C in its terminal)")
    return _said(run.id, f"not running ({run.status}); nothing to stop", True, as_json)


def _terminate(run_id: str, doc: dict, as_json: bool) -> int:
    pid = doc["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + WAIT_S
    while launcher_alive(doc) and time.monotonic() < deadline:
        time.sleep(0.2)
    gone = not launcher_alive(doc)
    return _said(run_id, f"hrmctl (pid {pid}) sent SIGTERM" + ("; it stopped every node" if gone
                                                               else f"; still running after {WAIT_S:.0f}s"),
                 gone, as_json)


def _said(run_id: str, what: str, ok: bool, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"run_id": run_id, "stopped": ok, "detail": what}))
    else:
        print(f"run {run_id}: {what}")
    return 0 if ok else 1
