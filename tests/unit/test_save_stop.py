"""`kill -USR1` to hrmctl's launcher (what Slurm's time-limit signal does, docs/slurm.md), on this machine: every
rank saves a checkpoint at the step they agree on and ends, the run is recorded as stopped with exit code 138, and
`resume=latest` goes on from that checkpoint (real torchrun and trainer; the Slurm and SSH cases are in
tests/cluster/test_slurm.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.polling import wait_for
from tests.trainer.helpers import python_env

pytestmark = pytest.mark.slow

ARGS = ["model=tiny", "training.batch_size=8", "training.log_interval=5", "training.checkpoint_interval=0",
        "logging.curves=false", "training.eval_interval=0", "training.eval_batches=1", "training.schedule=constant"]


def _steps(run_dir) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_sigusr1_saves_every_rank_at_one_step_and_the_run_resumes_from_it(tmp_path, sudoku_data):
    data = sudoku_data(600)
    cmd = [sys.executable, "-m", "cli", "train", "--nproc", "2", "--run-id", "u1", *ARGS, f"data_dir={data}"]
    proc = subprocess.Popen([*cmd, "training.max_steps=100000"], cwd=tmp_path, env=python_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    run_dir = tmp_path / "runs" / "u1"
    wait_for(lambda: len(_steps(run_dir)) >= 2 or proc.poll() is not None, 240, "the run's first steps", every=0.2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGUSR1, out[-2000:] + err[-2000:]
    assert "SIGUSR1: every rank saves a checkpoint" in out and "stopped by SIGUSR1" in err, out[-2000:] + err[-2000:]
    saved = sorted(run_dir.glob("checkpoint-*"))
    assert len(saved) == 1, saved
    at = int(saved[0].name.split("-")[1])
    assert f"stopped at step {at}/100000 on SIGUSR1" in out
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"

    res = subprocess.run([*cmd, f"training.max_steps={at + 5}", "resume=latest"], cwd=tmp_path, env=python_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert f"resuming from runs/u1/checkpoint-{at} (step {at})" in res.stdout
    assert _steps(run_dir)[-1] == at + 5
