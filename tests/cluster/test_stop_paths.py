"""Every way a run is stopped from outside, for real: `hrmctl train ... | tee` with the tee killed, `| head -5`,
SIGTERM, SIGHUP (a closed terminal: the whole pipeline gets it), Ctrl-C (SIGINT to the whole pipeline).

Each leaves no process of the run on any node within 10 s, prints no traceback (ours or torchrun's), exits with
128 + the signal (141 for the reader gone, as SIGPIPE would), keeps the run's logs complete, and `hrmctl runs`
shows the run stopped. On two lab nodes over SSH, and two of the paths on this machine alone (no --nodes).
The pipelines are real: hrmctl's stdout is a pipe whose read end only the reader (`tee`, `head`) holds, both in
one process group as a shell makes them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.polling import wait_for

STOP_WITHIN_S = 10.0
# tiny and slow enough to be running when the stop comes (a stop that failed would end by itself); paced (about 8
# steps a second: fault.step_sleep) so that the ranks wait for the stop instead of taking both cores meanwhile
ARGS = ["model=tiny", "training.max_steps=3000", "training.batch_size=8", "training.log_interval=1",
        "training.eval_interval=0", "training.checkpoint_interval=0", "fault.step_sleep=0.1"]
# path: (the reader, what stops the run, exit code, the start of hrmctl's last line)
PATHS = {
    "tee-killed": ("tee", "kill the reader", 141, "stopped: nobody reads the output any more"),
    "head-5": ("head", "the reader ends", 141, "stopped: nobody reads the output any more"),
    "SIGTERM": ("tee", "SIGTERM to hrmctl", 143, "stopped by SIGTERM: every node stopped after "),
    "SIGHUP": ("tee", "SIGHUP to the pipeline", 129, "stopped by SIGHUP: every node stopped after "),
    "SIGINT": ("tee", "SIGINT to the pipeline", 130, "interrupted (Ctrl-C): every node stopped after "),
}


class Pipeline:
    """`hrmctl ARGS | tee` or `| head -5` in a process group of their own, hrmctl's stderr to a file."""

    def __init__(self, args: list[str], reader: str, cwd: Path, env: dict[str, str]):
        self.err_path, self.out_path = cwd / "hrmctl.err", cwd / "reader.out"
        with open(self.err_path, "w") as err_fh, open(self.out_path, "w") as out_fh:
            self.hrmctl = subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=cwd, env=env,
                                           stdout=subprocess.PIPE, stderr=err_fh, process_group=0)
            argv = ["tee", str(cwd / "tee.log")] if reader == "tee" else ["head", "-5"]
            self.reader = subprocess.Popen(argv, stdin=self.hrmctl.stdout, stdout=out_fh, cwd=cwd,
                                           process_group=self.hrmctl.pid)
        self.hrmctl.stdout.close()  # the reader alone holds the pipe's read end, as in a shell

    def output(self) -> str:
        return self.err_path.read_text() + self.out_path.read_text()

    def stop(self, how: str) -> None:
        if how == "kill the reader":
            self.reader.terminate()
        elif how == "the reader ends":
            self.reader.wait(120)
        elif how == "SIGTERM to hrmctl":
            self.hrmctl.send_signal(signal.SIGTERM)
        else:  # a closed terminal or Ctrl-C: the whole foreground process group
            os.killpg(self.hrmctl.pid, signal.SIGHUP if "SIGHUP" in how else signal.SIGINT)

    def end(self) -> None:
        for p in (self.hrmctl, self.reader):
            if p.poll() is None:
                p.kill()
                p.wait()


def user_processes(user: str) -> list[str]:
    """Every process of the node's user (seen from here: the lab's nodes share this machine's PID space)."""
    res = subprocess.run(["pgrep", "-a", "-u", user], capture_output=True, text=True)
    return res.stdout.splitlines()


def local_run_processes(run_id: str) -> list[str]:
    """Every process on this machine whose environment carries the run's id."""
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if f"HRMCTL_RUN_ID={run_id}".encode() in (d / "environ").read_bytes().split(b"\0"):
                found.append(d.name + " " + (d / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            pass
    return found


def stopped_within(t0: float, left) -> list[str]:
    """What is still running when the 10 s since the stop are up (nothing: the stop worked)."""
    while True:
        now = left()
        if not now or time.monotonic() > t0 + STOP_WITHIN_S:
            return now
        time.sleep(0.2)


def check_stop(pipe: Pipeline, path: str, run_dir: Path, t0: float, left) -> None:
    _, _, code, last = PATHS[path]
    try:
        pipe.hrmctl.wait(max(0.1, t0 + STOP_WITHIN_S - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail(f"hrmctl still running {STOP_WITHIN_S:g}s after the stop:\n{pipe.output()[-3000:]}")
    still = stopped_within(t0, left)
    assert still == [], f"processes of the run left {STOP_WITHIN_S:g}s after the stop: {still}"
    pipe.reader.wait(10)
    out = pipe.output()
    assert pipe.hrmctl.returncode == code, out[-3000:]
    assert "Traceback" not in out and "SignalException" not in out, out[-3000:]
    err = pipe.err_path.read_text().strip().splitlines()
    assert err and err[-1].startswith(last) and "every node stopped after " in err[-1], err
    assert err[-1].endswith(f"; logs in runs/{run_dir.name}/"), err
    for log in run_dir.glob("*.log"):  # the record is whole: to the stop's end, without torchrun's traceback
        text = log.read_text()
        assert text.rstrip().endswith(": every node stopped"), text[-2000:]
        assert "SignalException" not in text, text[-3000:]


def runs_state(cwd: Path, run_id: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "cli", "runs", "--json"], cwd=cwd, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return next(r for r in json.loads(res.stdout) if r["id"] == run_id)


def first_step(pipe: Pipeline, log: Path):
    if pipe.hrmctl.poll() is not None:
        pytest.fail(f"hrmctl ended before the first step:\n{pipe.output()[-3000:]}")
    return log.exists() and "[rank0]:step " in log.read_text()


@pytest.mark.parametrize("path", list(PATHS))
def test_a_stop_from_outside_leaves_nothing_on_any_node_and_no_traceback(lab3, tmp_path, path):
    reader, how, code, _ = PATHS[path]
    run_id = f"stop-{path.lower()}"
    env = dict(os.environ, HRMCTL_INVENTORY=str(lab3.inventory))
    pipe = Pipeline(["train", "--nodes", "node0,node1", "--run-id", run_id, *ARGS], reader, tmp_path, env)
    users = [n.user for n in lab3.nodes[:2]]
    try:
        if path != "head-5":  # head ends by itself after five lines, whatever the run is doing then
            wait_for(lambda: first_step(pipe, tmp_path / "runs" / run_id / "node0.log"), 180, "the first step",
                     show=pipe.output)
            assert all(user_processes(u) for u in users), "the run is not running on both nodes"
        pipe.stop(how)
        t0 = time.monotonic()
        check_stop(pipe, path, tmp_path / "runs" / run_id, t0, lambda: sum((user_processes(u) for u in users), []))
    finally:
        pipe.end()
    state = runs_state(tmp_path, run_id)
    assert state["status"] == "stopped" and state["exit_code"] == code, state


@pytest.mark.parametrize("path", ["head-5", "SIGINT"])
def test_a_stop_from_outside_of_a_run_on_this_machine_alone(lab3, tmp_path, path):
    """No --nodes: torchrun here, in a session of its own (a terminal's Ctrl-C reaches hrmctl only)."""
    reader, how, code, _ = PATHS[path]
    run_id = f"stop-local-{path.lower()}"
    shutil.copytree(lab3.nodes[0].home / "hrmctl" / "data" / "sudoku", tmp_path / "data" / "sudoku")  # made once
    pipe = Pipeline(["train", "--run-id", run_id, *ARGS], reader, tmp_path, dict(os.environ))
    try:
        if path != "head-5":
            wait_for(lambda: first_step(pipe, tmp_path / "runs" / run_id / "localhost.log"), 180, "the first step",
                     show=pipe.output)
        pipe.stop(how)
        t0 = time.monotonic()
        check_stop(pipe, path, tmp_path / "runs" / run_id, t0, lambda: local_run_processes(run_id))
    finally:
        pipe.end()
    assert runs_state(tmp_path, run_id)["status"] == "stopped"
