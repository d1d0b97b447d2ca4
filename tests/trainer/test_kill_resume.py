"""A rank killed mid-run (fault.kill_at_step): the others stop in bounded time, the last checkpoint
is intact, and a restart with --resume continues from it. Each rank is its own `python -m
auralm.training.train` process joined by MASTER_ADDR/MASTER_PORT, as on separate nodes (no torchrun agent
to clean up after it)."""

from __future__ import annotations

import subprocess
import time

import pytest

from auralm.training import checkpoint
from tests.trainer.helpers import PYTHON, free_port, python_env, records, tiny_args

pytestmark = pytest.mark.slow


def _start(world, args, cwd):
    port = str(free_port())
    return [subprocess.Popen([PYTHON, "-m", "auralm.training.train", *args], cwd=cwd, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE,
                             env=python_env(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK="0",
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
            for r in range(world)]


def test_a_killed_rank_stops_the_others_and_resume_continues_from_the_last_checkpoint(tmp_path, sudoku_data):
    sudoku = sudoku_data(600)
    run = tmp_path / "run"
    args = tiny_args(sudoku, run, "training.max_steps=10", "training.checkpoint_interval=3", "training.keep_last=5")
    procs = _start(2, args + ["fault.kill_at_step=8", "fault.kill_rank=1"], tmp_path)
    killed_out, killed_err = procs[1].communicate(timeout=300)
    assert procs[1].returncode == -9 and "fault: killing rank 1 at step 8" in killed_err
    died = time.monotonic()
    out, err = procs[0].communicate(timeout=300)
    assert time.monotonic() - died < 30  # gloo notices the closed connection; no hang until a timeout
    assert procs[0].returncode == 1
    assert err.strip().splitlines()[-1].startswith("error: rank 0: ") and "Traceback" not in err
    assert [checkpoint.step_of(c) for c in checkpoint.list_checkpoints(run)] == [6, 3]
    assert checkpoint.problem(run / "checkpoint-6") is None

    procs = _start(2, args + ["--resume"], tmp_path)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert f"resuming from {run / 'checkpoint-6'} (step 6)" in outs[0][0]
    steps = [r["step"] for r in records(run)]
    assert steps[-4:] == [7, 8, 9, 10] and 7 in steps[:7]  # steps 7 (before the kill) and 7..10 again
    assert checkpoint.problem(run / "checkpoint-10") is None
