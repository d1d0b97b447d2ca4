"""A stop asked from outside (auralm/training/stop_request.py): inside a Slurm job, SIGTERM to one rank only (what
Slurm sends on scancel, scontrol requeue or preemption) stops every rank at the same step with a checkpoint there,
exit 0; the run resumed from it ends where an uninterrupted run of the same length ends, to the last digit. Each
rank is its own `python -m auralm.training.train` process, as on separate nodes."""

from __future__ import annotations

import signal
import subprocess

import pytest

from auralm.training import checkpoint
from tests.polling import wait_for
from tests.trainer.helpers import PYTHON, free_port, python_env, records, tiny_args

pytestmark = pytest.mark.slow


def _start(args, cwd, **env):
    port = str(free_port())
    return [subprocess.Popen([PYTHON, "-m", "auralm.training.train", *args], cwd=cwd, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE,
                             env=python_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                                            MASTER_PORT=port, **env))
            for r in range(2)]


CONSTANT = "training.schedule=constant"  # the learning rate after the warmup does not depend on max_steps


def _losses(run) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run) if "loss" in r}


def test_sigterm_in_a_slurm_job_saves_at_an_agreed_step_and_resumes_exactly(tmp_path, sudoku_data):
    data = sudoku_data(600)
    run = tmp_path / "run"
    procs = _start(tiny_args(data, run, "training.max_steps=100000", CONSTANT), tmp_path, SLURM_JOB_ID="42")
    wait_for(lambda: len(_losses(run)) >= 3 or any(p.poll() is not None for p in procs), timeout=240, every=0.1,
             what="the run's first steps")
    procs[1].send_signal(signal.SIGTERM)  # one rank only: the other learns it from the agreement
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    ckpts = checkpoint.list_checkpoints(run)
    assert len(ckpts) == 1 and checkpoint.problem(ckpts[0]) is None, ckpts
    at = checkpoint.step_of(ckpts[0])
    assert f"stopped at step {at}/100000 on SIGTERM: checkpoint {ckpts[0]} saved" in outs[0][0], outs[0][0][-2000:]
    assert max(_losses(run)) == at

    end = at + 3
    procs = _start(tiny_args(data, run, f"training.max_steps={end}", CONSTANT, "--resume"), tmp_path)
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:]
    assert f"resuming from {ckpts[0]} (step {at})" in outs[0][0]
    again = tmp_path / "again"
    procs = _start(tiny_args(data, again, f"training.max_steps={end}", CONSTANT), tmp_path)
    assert [p.wait(timeout=240) for p in procs] == [0, 0]
    resumed, straight = _losses(run), _losses(again)
    assert [resumed[s] for s in range(at + 1, end + 1)] == [straight[s] for s in range(at + 1, end + 1)]
