"""`hrmctl attach RUN` and `hrmctl stop RUN`: a running run, detached (`hrmctl train --detach`) or not, from any
terminal of the machine its launcher runs on.

attach  the last lines of the merged log, then every new one until the run ends (cli/runs/logs.py --follow); then
        the launcher's own last line; the exit code is the run's (status.json). Ctrl-C detaches: the run goes on.
stop    SIGTERM to the run's launcher (status.json's pid, checked with its start time so that a later process given
        the same pid is never signalled). The launcher stops the job on every node as for any SIGTERM
        (cli/launch/run/attempt.py: hang-up, then every process tagged with the job, SIGTERM, SIGKILL) and records the
        end; stop waits for that record and says what it found: every node stopped, or where the stop was not confirmed.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TextIO

from cli.errors import HrmctlError
from cli.runs.catalog import last_line, launcher_alive, load_run, read_status, read_submitted, slurm_job_of
from cli.runs.logs import show_logs
from cli.runs.states import ACTIVE, RunState

ATTACH_LINES = 20  # of the merged log, before the new ones
STOP_WAIT_S = 60.0  # the launcher's own stop takes seconds (a 1.5 s settle, a 3 s grace, 2 s for the last lines)
SUPERVISOR_ERR = "supervisor.err"  # cli/launch/supervise/detach.py's: where a detached launcher's last line is


def _ending(run_path: Path) -> tuple[str, int]:
    """The run's last line (its detached launcher's own, else status.json's reason) and its exit code."""
    run = load_run(run_path)
    code = run.exit_code if run.exit_code is not None else (0 if run.status == RunState.FINISHED else 1)
    line = last_line(run_path / SUPERVISOR_ERR) if code and read_status(run_path).get("detached") else ""
    if not line or line.startswith("hrmctl: run "):  # its error line, else the record's
        line = f"run {run.id} {run.status}" + (f": {run.reason}" if run.reason else "") + f" (exit code {code})"
    return line, code


def attach(run_path: Path, *, out: TextIO | None = None, err: TextIO | None = None, last: int = ATTACH_LINES) -> int:
    """Follow the run until it ends; its exit code. Ctrl-C: detached, the run goes on, exit code 0."""
    out, err = out or sys.stdout, err or sys.stderr
    run = load_run(run_path)
    if run.status != RunState.RUNNING:
        show_logs(run_path, out=out, last=last) if any(run_path.glob("*.log")) else None
        line, code = _ending(run_path)
        print(f"hrmctl: run {run.id} is not running; {line}", file=err)
        return code
    try:
        show_logs(run_path, follow=True, out=out, last=last)
    except KeyboardInterrupt:
        print(f"\nhrmctl: detached from run {run.id}; it goes on (`hrmctl attach {run.id}` to follow it again, "
              f"`hrmctl stop {run.id}` to stop it)", file=err, flush=True)
        return 0
    line, code = _ending(run_path)
    print(line, file=err, flush=True)
    return code


def stop(run_path: Path, *, err: TextIO | None = None, wait_s: float = STOP_WAIT_S) -> int:
    """SIGTERM to the run's launcher, then wait for its record of the end: 0 when every node stopped. A Slurm run
    submitted with --slurm (or one launched inside an allocation whose launcher is not on this machine) is
    cancelled instead (scancel), and waited for until Slurm says its job has ended: Slurm has then killed what was
    left of it on every node."""
    err = err or sys.stderr
    run, doc = load_run(run_path), read_status(run_path)
    submitted = read_submitted(run_path)
    job = slurm_job_of(doc, submitted)
    if job and run.status in ACTIVE and (submitted or not launcher_alive(doc)):
        return _cancel(run.id, job, err, wait_s)  # a --slurm job, or an allocation's run launched elsewhere
    if run.status != RunState.RUNNING:
        print(f"hrmctl: run {run.id} is not running ({run.status}{': ' + run.reason if run.reason else ''}); "
              f"nothing to stop", file=err)
        return 0
    pid, host = doc.get("pid"), doc.get("host")
    if host != socket.gethostname():
        where = f"on {host}" if host else "without hrmctl (no status.json)"
        raise HrmctlError(f"run {run.id} was started {where}: its launcher can be stopped only there "
                          f"(`hrmctl stop {run.id}` on {host or 'the machine that runs it'})", exit_code=1)
    if not launcher_alive(doc):
        raise HrmctlError(f"run {run.id}: its launcher (pid {pid}) is gone without recording the end; processes it "
                          f"left on the nodes are not reachable from here: see `hrmctl logs {run.id}` for the nodes",
                          exit_code=1)
    os.kill(pid, signal.SIGTERM)
    print(f"hrmctl: run {run.id}: SIGTERM to its launcher (pid {pid}); stopping it on every node", file=err, flush=True)
    t0 = time.monotonic()
    while launcher_alive(doc) and time.monotonic() - t0 < wait_s:
        time.sleep(0.2)
    after = read_status(run_path)
    if after.get("state") == RunState.RUNNING:
        print(f"error: run {run.id}: its launcher (pid {pid}) did not end within {wait_s:.0f}s; "
              f"`kill -TERM {pid}` again, or see `hrmctl logs {run.id}`", file=err)
        return 1
    left = {n: c for n, c in (after.get("left_running") or {}).items() if c}
    if left:
        where = ", ".join(f"{n} ({'unreachable' if c < 0 else f'{c} processes left'})" for n, c in left.items())
        print(f"error: run {run.id} stopped, but the stop could not be confirmed on {where}", file=err)
        return 1
    print(f"run {run.id} stopped: every node stopped after {time.monotonic() - t0:.1f}s "
          f"({after.get('reason') or after.get('state')})", file=err)
    return 0


def _cancel(run_id: str, job: str, err: TextIO, wait_s: float) -> int:
    from cli.slurm.jobs import ENDED, cancel

    print(f"hrmctl: run {run_id}: scancel {job}; waiting for Slurm to end it on every node", file=err, flush=True)
    t0 = time.monotonic()
    state = cancel(job, wait_s)
    said = f"Slurm job {job} {state['state'] if state else 'gone'}"
    if state is not None and state["state"] not in ENDED:
        print(f"error: run {run_id}: {said}, still not ended after {wait_s:.0f}s; see `squeue -j {job}`", file=err)
        return 1
    print(f"run {run_id} stopped: {said} after {time.monotonic() - t0:.1f}s", file=err)
    return 0
