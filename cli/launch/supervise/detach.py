"""`hrmctl train --detach`: the run's supervisor (this same launcher, `hrmctl train ... --supervisor`) started in a
session of its own, so that it outlives the terminal, the SSH session or the shell that started it.

The supervisor is `python -m cli train <the same arguments> --run-id ID --supervisor`, started with setsid (a new
session: no controlling terminal, so a closed terminal's SIGHUP never reaches it), stdin from /dev/null, stdout and
stderr to runs/<run-id>/supervisor.out and supervisor.err. It is the ordinary launcher: it checks, plans, runs,
stops everywhere and records status.json (with its own pid) as a run in the foreground does. This process waits
until status.json records rank 0's first step (cli/launch/supervise/status.py: first_step), then prints the run id and
how to attach and stop, and returns 0. A supervisor that ends before the first step ends this command with its exit code
and its last line (the run's one-line reason: a refused preflight, a bad override, a failed rank).
`hrmctl attach` and `hrmctl stop` are cli/runs/control.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from cli.errors import HrmctlError
from cli.launch.preflight.prepare import new_run_id
from cli.runs.catalog import last_line, read_status
from cli.runs.states import RunState

SUPERVISOR_OUT, SUPERVISOR_ERR = "supervisor.out", "supervisor.err"
POLL_S = 0.2


def supervisor_argv(argv: list[str], run_id: str) -> list[str]:
    """The command line of the supervisor: hrmctl's own arguments without --detach, with the run id and
    --supervisor. ``argv`` as hrmctl got it (``train ...``); a --run-id there is kept (and is ``run_id``)."""
    args = [a for a in argv if a != "--detach"]
    if not any(a == "--run-id" or a.startswith("--run-id=") for a in args):
        args += ["--run-id", run_id]
    return [sys.executable, "-m", "cli", *args, "--supervisor"]


def detach(argv: list[str], run_id: str | None, runs_dir: Path, console: Console, err: Console,
           as_json: bool = False) -> int:
    """Start the supervisor in a session of its own and wait for the run's first step (or its end). ``as_json``:
    stdout is one JSON document (run_id, supervisor_pid, state: running, or the exit code and reason of an end)."""
    run_id = run_id or new_run_id()
    run_dir = runs_dir / run_id
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        out = open(run_dir / SUPERVISOR_OUT, "ab")
        errf = open(run_dir / SUPERVISOR_ERR, "ab")
    except OSError as exc:
        raise HrmctlError(f"cannot write the run's files in {run_dir}: {exc.strerror}; fix: run hrmctl from a "
                          f"directory you can write", exit_code=1) from None
    with out, errf:
        proc = subprocess.Popen(supervisor_argv(argv, run_id), stdin=subprocess.DEVNULL, stdout=out, stderr=errf,
                                start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    t0 = time.monotonic()
    err.print(f"hrmctl: run {run_id}: supervisor started detached (pid {proc.pid}); waiting for its first step",
              markup=False, highlight=False, soft_wrap=True)
    try:
        while True:
            code = proc.poll()
            if code is not None:  # a supervisor killed by a signal: 128 + it, as a shell reports it
                return _ended_early(run_id, run_dir, code if code >= 0 else 128 - code, console, err, as_json)
            if read_status(run_dir).get("first_step"):
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        err.print(f"hrmctl: run {run_id} goes on detached; `hrmctl stop {run_id}` stops it", markup=False,
                  highlight=False, soft_wrap=True)
        return 130
    if as_json:
        console.print_json(json.dumps({"run_id": run_id, "supervisor_pid": proc.pid, "state": RunState.RUNNING,
                                       "first_step_s": round(time.monotonic() - t0, 1), "run_dir": str(run_dir)}))
        return 0
    console.print(f"run {run_id}: running detached (supervisor pid {proc.pid}), first step after "
                  f"{time.monotonic() - t0:.1f}s\n"
                  f"  hrmctl attach {run_id}   follow it (Ctrl-C leaves it running)\n"
                  f"  hrmctl stop {run_id}     stop it on every node\n"
                  f"  logs in {run_dir}/", markup=False, highlight=False, soft_wrap=True)
    return 0


def _ended_early(run_id: str, run_dir: Path, code: int, console: Console, err: Console, as_json: bool) -> int:
    """The supervisor ended before a first step was logged: its last line is the reason (or the run was short). Ended
    before it started the run (no status.json: bad input, a refused preflight), it leaves no run directory behind, as
    the same command in the foreground would not."""
    reason = last_line(run_dir / SUPERVISOR_ERR)
    if not (run_dir / "status.json").exists():
        for name in (SUPERVISOR_OUT, SUPERVISOR_ERR):
            (run_dir / name).unlink(missing_ok=True)
        try:
            run_dir.rmdir()
        except OSError:
            pass
    if as_json:
        console.print_json(json.dumps({"run_id": run_id, "state": RunState.FINISHED if code == 0 else RunState.FAILED,
                                       "exit_code": code, "reason": reason,
                                       "run_dir": str(run_dir)}))
        return code
    if code == 0:
        console.print(f"run {run_id}: finished before its first step was seen; logs in {run_dir}/", markup=False,
                      highlight=False, soft_wrap=True)
        return 0
    line = reason or f"error: the supervisor of run {run_id} ended with exit code {code}"
    err.print(line, markup=False, highlight=False, soft_wrap=True)
    return code
