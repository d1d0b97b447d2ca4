"""A run whose every step is NaN (fault injection) stops with one line naming the cause and the override, non-zero
on every rank: in one process, under torchrun with two gloo ranks, and through `hrmctl train`, whose `hrmctl runs`
then shows it failed. Before the stop existed these runs skipped every step and ended "finished"."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from auralm.training import train
from tests.trainer.helpers import PYTHON, by_step, python_env

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

FIX = "fault.nan_at_step puts NaN into rank {rank}'s gradients at these steps"


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(200)


def args(data, out, *extra):
    """A small sudoku run with a record of every step; out None: no out_dir (hrmctl gives the run's own)."""
    return [f"data_dir={data}", *([f"out_dir={out}"] if out else []), "model=tiny", "model.n_embd=32", "model.n_head=2",
            "logging.curves=false", "training.batch_size=4", "training.log_interval=1", "training.eval_interval=0",
            "training.checkpoint_interval=0", *extra]


def error_lines(text: str) -> list[str]:
    return [l for l in text.splitlines() if "error:" in l]


def test_one_process_stops_after_twenty_skipped_steps_with_one_line_exit_2(sudoku_dir, tmp_path, capsys):
    code = train.main(args(sudoku_dir, tmp_path / "run", "training.max_steps=30", "fault.nan_at_step=1-30"))
    err = capsys.readouterr().err
    assert code == 2
    [line] = error_lines(err)
    assert line.startswith("error: nan guard: stopping: all 20 steps 1-20 skipped on every rank (non-finite "
                           "gradients on rank 0), and no update was applied in this run: ")
    assert FIX.format(rank=0) in line and line.endswith("; rerun without fault.nan_at_step")
    assert "Traceback" not in err
    assert max(by_step(tmp_path / "run")) == 19  # stopped at step 20, before its record: never "reached the end"


def test_torchrun_two_gloo_ranks_stop_together_with_one_line(sudoku_dir, tmp_path):
    res = subprocess.run(
        [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "auralm.training.train",
         *args(sudoku_dir, tmp_path / "run", "training.max_steps=40", "fault.nan_at_step=1-40", "fault.nan_rank=1")],
        capture_output=True, text=True, timeout=400, env=python_env(HRMCTL_BACKEND="gloo"), cwd=tmp_path)
    assert res.returncode != 0
    [line] = [l for l in error_lines(res.stderr) if "nan guard" in l]  # rank 0 says it, once
    assert line.startswith("error: nan guard: stopping: all 20 steps 1-20 skipped on every rank (non-finite "
                           "gradients on rank 1)")
    assert FIX.format(rank=1) in line
    # torchrun's report: both workers exited 2 (the same stop on every rank, not one rank dying and the other
    # failing on a broken connection)
    codes = dict(re.findall(r"rank\s*: (\d) \(local_rank: \d\)\s*exitcode\s*: (-?\d+)", res.stderr))
    assert codes == {"0": "2", "1": "2"}, res.stderr[-3000:]
    assert max(by_step(tmp_path / "run")) == 19


def test_hrmctl_train_shows_the_run_failed_and_runs_says_so(sudoku_dir, tmp_path):
    """A run shorter than the window, every step skipped: stopped at its last step, never reported finished; the
    guard's line is the run's reason (hrmctl's last line, status.json, `hrmctl runs --json`), and --max-restarts 2
    does not restart it (a restart would stop the same way)."""
    env = python_env()
    res = subprocess.run([sys.executable, "-m", "cli", "train", "--run-id", "nan1", "--max-restarts", "2",
                          *args(sudoku_dir, None, "training.max_steps=4", "fault.nan_at_step=1-4")],
                         capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-2000:]
    [line] = [l for l in error_lines(out) if "nan guard" in l and "│" in l]  # the node's line, once
    assert "all 4 steps 1-4 skipped on every rank" in line and line.endswith("rerun without fault.nan_at_step")
    guard = line[line.index("error: ") + len("error: "):]
    last = res.stderr.strip().splitlines()[-1]  # hrmctl's: the guard's line, where and when, the logs
    assert last.startswith(f"error: {guard} (rank 0 on localhost, after ") and last.endswith("logs in runs/nan1/")
    assert "no restart (0 of 2 made): the trainer stopped with exit code 2" in out, out[-3000:]
    assert "Traceback" not in out and "ChildFailedError" not in out  # torchrun's report: in the node's file only
    assert "restart 1 of 2" not in out and "attempt 2" not in (tmp_path / "runs" / "nan1" / "localhost.log").read_text()
    status = json.loads((tmp_path / "runs" / "nan1" / "status.json").read_text())
    assert status["state"] == "failed" and status["exit_code"] != 0
    assert (status["reason"], status["attempts"], status["failed_rank"]) == (guard, 1, 0)
    res = subprocess.run([sys.executable, "-m", "cli", "runs", "--json"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, env=env)
    [entry] = json.loads(res.stdout)
    assert (entry["id"], entry["status"], entry["steps"], entry["reason"]) == ("nan1", "failed", 3, guard)
    assert entry["no_restart"].startswith("the trainer stopped with exit code 2")
