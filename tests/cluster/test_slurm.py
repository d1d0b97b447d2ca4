"""hrmctl on a real Slurm cluster (lab/slurm.py: munged and slurmctld here, one slurmd in each of two lab nodes'
namespaces, made by this module's fixture and torn down after it). Jobs run as root from the test's directory, which
every node sees (a cluster's shared file system); the trainer is this checkout's, through this Python.

  - `hrmctl train --slurm --nodes 2`: the script (--dry-run), the job submitted, trained on both nodes (one torchrun
    each, started with srun); Slurm's time-limit signal (SIGUSR1) has the ranks save, stops it and requeues it;
    `scontrol requeue` (SIGTERM) has them save; each next start resumes from the saved step; COMPLETED with every
    step trained once; `hrmctl runs --json` lists it with the job id and Slurm's state;
  - inside `salloc -N 2`, `hrmctl doctor` and `hrmctl top` see the allocation's nodes over srun, and `hrmctl train`
    takes them and trains the same way;
  - `hrmctl stop` of a running job: cancelled, and no process of it left on any node;
  - bad input: no Slurm commands here; a partition Slurm refuses.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from tests.polling import wait_for

TINY = ["model=tiny", "training.max_steps=4", "training.batch_size=8", "training.log_interval=1",
        "training.checkpoint_interval=2", "training.eval_interval=0", "training.eval_batches=1", "logging.curves=false"]


@pytest.fixture(scope="module")
def slurm(make_lab):
    from lab.slurm import LabSlurm, missing_slurm

    why = missing_slurm()
    if why:
        pytest.fail(f"the Slurm tier cannot run: {why}")
    lab = make_lab(2, bare=True)  # the nodes run this checkout from the shared file system: nothing copied
    with LabSlurm(lab) as cluster:
        yield cluster


@pytest.fixture
def run_hrmctl(slurm, tmp_path):
    import subprocess

    def run(*args: str, timeout: float = 120, env: dict | None = None):
        proc = subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=timeout,
                              cwd=tmp_path, env=slurm.env(env))
        return proc.returncode, proc.stdout, proc.stderr

    return run


def _runs(run_hrmctl) -> dict[str, dict]:
    code, out, err = run_hrmctl("runs", "--json")
    assert code == 0, err
    return {r["id"]: r for r in json.loads(out)}


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _slurm_state(job: str, env: dict) -> str:
    import subprocess

    out = subprocess.run(["squeue", "-h", "--states=all", "-j", job, "-o", "%T"], capture_output=True, text=True,
                         env=env).stdout.split()
    return out[0] if out else ""


def _steps(run_dir: Path) -> list[int]:
    return [m["step"] for m in _metrics(run_dir) if "loss" in m]


def test_submitted_run_trains_saves_on_signals_requeues_resumes_and_is_listed(run_hrmctl, sudoku_data, tmp_path,
                                                                               slurm):
    """One job proves the submission (the script, the job on two nodes, COMPLETED, listed with its Slurm state) and
    both ways a job is cut short: Slurm's time-limit signal (SIGUSR1 to the batch shell, sent here with scancel, as
    --signal would send it), on which hrmctl has the ranks save and requeues the job; and `scontrol requeue`
    (SIGTERM to every process of the job), on which the ranks save. No periodic checkpoints: each start resumes
    from the checkpoint of the step the signal stopped at, so every step is trained exactly once."""
    import subprocess

    steps = 150
    # one CPU a node, as the lab's nodes share this machine's two: the lab's Slurm binds nothing (TaskPlugin=task/none),
    # so the ranks' threads follow the job's SLURM_CPUS_PER_TASK (two a rank spun against each other: 4x the CPU)
    args = ["train", "--slurm", "--nodes", "2", "--cpus-per-task", "1", "--time", "00:10:00", "--run-id", "sub1",
            *TINY[:1], f"training.max_steps={steps}", "training.batch_size=8", "training.log_interval=1",
            "training.checkpoint_interval=0", "training.eval_interval=0", "training.eval_batches=1",
            f"data_dir={sudoku_data()}"]
    code, out, err = run_hrmctl(*args, "--dry-run")
    assert code == 0, err
    assert "#SBATCH --nodes=2" in out and "#SBATCH --cpus-per-task=1" in out, out
    assert "#SBATCH --signal=B:USR1@" in out and "#SBATCH --requeue" in out, out
    assert " -m cli.slurm.job --run-id sub1 " in out and not (tmp_path / "runs" / "sub1").exists()

    code, out, err = run_hrmctl(*args)
    assert code == 0 and "as Slurm job" in out, out + err
    run_dir = tmp_path / "runs" / "sub1"
    job = json.loads((run_dir / "slurm.json").read_text())["job_id"]
    slurm_out = run_dir / f"slurm-{job}.out"
    show = lambda: slurm_out.read_text()[-3000:] if slurm_out.exists() else ""  # noqa: E731
    wait_for(lambda: len(_steps(run_dir)) >= 5, timeout=120, every=0.2, what="the first steps", show=show)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, env=slurm.env())
    wait_for(lambda: "resuming from" in (run_dir / "node0.log").read_text(), timeout=120, every=0.5,
             what="the requeued start to resume", show=show)
    first = max(_steps(run_dir))
    wait_for(lambda: max(_steps(run_dir)) >= first + 5, timeout=120, every=0.2, what="steps after the resume",
             show=show)
    subprocess.run(["scontrol", "requeue", job], check=True, env=slurm.env())
    wait_for(lambda: _slurm_state(job, slurm.env()) in ("COMPLETED", "FAILED", "CANCELLED"), timeout=240, every=1.0,
             what="the job to end", show=show)
    text, log = slurm_out.read_text(), (run_dir / "node0.log").read_text()
    assert f"requeueing job {job}" in text and "stopped by SIGUSR1" in text, text[-3000:]
    saved = [int(line.split("stopped at step ")[1].split("/")[0]) for line in log.splitlines()
             if "stopped at step " in line]
    assert "# env: OMP_NUM_THREADS=1" in log, log[:3000]
    assert len(saved) == 2 and "on SIGUSR1: checkpoint" in log and "on SIGTERM: checkpoint" in log, log[-3000:]
    assert [f"checkpoint-{s} (step {s})" in log for s in saved] == [True, True], saved  # resumed from each
    assert _steps(run_dir) == list(range(1, steps + 1)), "every step trained exactly once"
    run = _runs(run_hrmctl)["sub1"]
    assert run["status"] == "finished", (run, text[-3000:])
    assert run["slurm_job"] == job and run["slurm_state"] == "COMPLETED", run
    assert run["nodes"] == ["node0", "node1"] and run["world"] == 2, run
    assert "nodes: Slurm allocation" in text


def test_inside_salloc_doctor_top_and_train_use_the_allocation(run_hrmctl, sudoku_data, tmp_path, slurm):
    import subprocess

    # over the doctor's own --timeout (120 s): a slow node's answer is the doctor's to report, not this limit's
    doctor = subprocess.run(["salloc", "-N", "2", "--", sys.executable, "-m", "cli", "doctor", "--json"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=slurm.env())
    report = json.loads(doctor.stdout)
    assert doctor.returncode == 0 and report["summary"]["fail"] == 0, doctor.stdout[-3000:] + doctor.stderr[-2000:]
    assert set(report["nodes"]) == {"node0", "node1"} and "srun (Slurm job" in doctor.stdout, doctor.stdout[-3000:]
    top = subprocess.run(["salloc", "-N", "2", "--", sys.executable, "-m", "cli", "top", "--once", "--json"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path, env=slurm.env())
    seen = {n["name"]: n for n in json.loads(top.stdout)["nodes"]}
    assert top.returncode == 0 and set(seen) == {"node0", "node1"} and all(n["ok"] for n in seen.values()), top.stdout
    proc = subprocess.run(["salloc", "-N", "2", "--", sys.executable, "-m", "cli", "train", "--run-id", "alloc1", *TINY,
                           f"data_dir={sudoku_data()}"], capture_output=True, text=True, timeout=150, cwd=tmp_path,
                          env=slurm.env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "nodes: Slurm allocation" in proc.stderr and "node0, node1 (reached with srun)" in proc.stderr
    status = json.loads((tmp_path / "runs" / "alloc1" / "status.json").read_text())
    assert status["state"] == "finished" and status["nodes"] == ["node0", "node1"], status
    logs = {p.name: p.read_text() for p in (tmp_path / "runs" / "alloc1").glob("*.log")}
    assert set(logs) == {"node0.log", "node1.log"}, logs.keys()
    assert [m["step"] for m in _metrics(tmp_path / "runs" / "alloc1") if "loss" in m][-1] == 4


def _tagged(run_id: str) -> list[int]:
    """This run's processes anywhere on the machine (the lab's nodes share its PID namespace)."""
    found = []
    for p in psutil.process_iter(["environ"], ad_value=None):
        if (p.info["environ"] or {}).get("HRMCTL_RUN_ID") == run_id:
            found.append(p.pid)
    return found


def test_stop_cancels_the_job_and_leaves_nothing(run_hrmctl, sudoku_data, tmp_path):
    long = [a for a in TINY if not a.startswith(("training.max_steps", "training.checkpoint_interval"))]
    code, out, err = run_hrmctl("train", "--slurm", "--nodes", "2", "--run-id", "stop1", *long,
                                "training.max_steps=100000", "training.checkpoint_interval=0",
                                "fault.step_sleep=0.1", f"data_dir={sudoku_data()}")  # paced: waits for the stop
    assert code == 0, out + err
    wait_for(lambda: len(_metrics(tmp_path / "runs" / "stop1")) >= 2, timeout=120, every=0.5,
             what="the run's first steps")
    assert _tagged("stop1"), "the run's processes should be running"
    code, out, err = run_hrmctl("stop", "stop1", timeout=90)
    assert code == 0 and "Slurm job" in err and "CANCELLED" in err, out + err
    assert _tagged("stop1") == [], "processes of the stopped run are left"
    run = _runs(run_hrmctl)["stop1"]
    assert run["status"] == "stopped" and run["slurm_state"] == "CANCELLED", run


def test_bad_input_is_one_line(run_hrmctl, tmp_path):
    code, out, err = run_hrmctl("train", "--slurm", "--nodes", "2", "--partition", "nosuch", *TINY)
    assert code == 2 and err.startswith("error: sbatch refused the job: ") and len(err.strip().splitlines()) == 1, err
    assert "partition" in err.lower()
    code, out, err = run_hrmctl("train", "--slurm", "--nodes", "2", "--gpus-per-node", "4", *TINY)
    assert code == 2 and err.startswith("error: sbatch refused the job: ") and len(err.strip().splitlines()) == 1, err
    assert "--gpus-per-node 4: more GPUs per node than the partition's nodes have" in err, err
    code, out, err = run_hrmctl("train", "--slurm", "--nodes", "2", *TINY, env={**os.environ, "PATH": "/nonexistent"})
    assert code == 2 and err.startswith("error: sbatch not found") and len(err.strip().splitlines()) == 1, err
