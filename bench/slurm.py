"""Time from `hrmctl train --slurm` to the first training step, against a hand-written sbatch script whose
`srun` starts the same torchrun on every node (what a cluster user writes today), on the same Slurm cluster,
alternated in the same run (target: hrmctl at most 1 s more).

The cluster is lab/slurm.py's (munged and slurmctld here, one slurmd in each of 2 lab nodes' namespaces). Both
runs train the same tiny model on the same data from the same directory (the shared file system), with the same
torchrun options and environment as hrmctl's plan (static rendezvous on the first node's address, gloo). The
clock starts when the submitting command starts (hrmctl, or sbatch for the hand-written script) and stops when
the trainer's metrics.jsonl gets its first step. hrmctl's extra is its own start inside the allocation, the
trainer's --check, and the preflight over srun (probes, directories, master port) before torchrun.

Root only. Usage: python bench/slurm.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.nodes import Lab  # noqa: E402
from lab.slurm import LabSlurm  # noqa: E402

TRAIN = ["model=tiny", "training.max_steps=3", "training.batch_size=8", "training.log_interval=1",
         "training.checkpoint_interval=0", "training.eval_interval=0", "training.eval_batches=1"]

HAND = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}/slurm-%j.out
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
addr=$(scontrol show node -o "$head" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
export OMP_NUM_THREADS=2 PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=eth0 HRMCTL_BACKEND=gloo HRMCTL_WORLD_SIZE=2
srun --kill-on-bad-exit=1 bash -c "exec {python} -m torch.distributed.run --nnodes=2 --node-rank=\\$SLURM_NODEID \\
  --nproc-per-node=1 --rdzv-backend=static --rdzv-id={run} --master-addr=$addr --master-port=29500 --max-restarts=0 \\
  -m auralm.training.train {args} out_dir={out}"
"""


def user_env(slurm: LabSlurm) -> dict[str, str]:
    """The cluster's environment as a user's shell has it: Python writes its bytecode caches (a test harness's
    PYTHONDONTWRITEBYTECODE would have every start compile hrmctl's modules again, which no user's does)."""
    env = slurm.env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def first_step(run_dir: Path, t0: float, timeout: float = 300) -> float:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if metrics.exists() and '"step"' in metrics.read_text():
            return time.perf_counter() - t0
        time.sleep(0.05)
    raise RuntimeError(f"no first step in {run_dir} after {timeout:g}s")


def wait_idle(slurm: LabSlurm) -> None:
    while subprocess.run(["squeue", "-h"], capture_output=True, text=True, env=slurm.env()).stdout.strip():
        time.sleep(0.2)


def hrmctl_run(slurm: LabSlurm, work: Path, data: Path, run: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli", "train", "--slurm", "--nodes", "2", "--run-id", run, *TRAIN,
                    f"data_dir={data}"], check=True, cwd=work, env=user_env(slurm), capture_output=True)
    return first_step(work / "runs" / run, t0)


def hand_run(slurm: LabSlurm, work: Path, data: Path, run: str) -> float:
    out = work / "runs" / run
    out.mkdir(parents=True)
    script = out / "hand.sbatch"
    script.write_text(HAND.format(out=out, python=sys.executable, run=run, args=" ".join([*TRAIN, f"data_dir={data}"])))
    t0 = time.perf_counter()
    subprocess.run(["sbatch", "--parsable", str(script)], check=True, cwd=work, env=user_env(slurm),
                   capture_output=True)
    return first_step(out, t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    from tests.trainer.helpers import small_sudoku

    times: dict[str, list[float]] = {"hrmctl": [], "hand": []}
    with Lab(2, bare=True) as lab, LabSlurm(lab) as slurm, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = small_sudoku(work / "sudoku", 1200)
        for i in range(args.repeat):
            for name, fn in (("hand", hand_run), ("hrmctl", hrmctl_run)):
                wait_idle(slurm)
                seconds = fn(slurm, work, data, f"{name}{i}")
                times[name].append(seconds)
            gap = times["hrmctl"][-1] - times["hand"][-1]
            print(f"round {i + 1}: hand {times['hand'][-1]:6.2f} s, hrmctl {times['hrmctl'][-1]:6.2f} s to the first "
                  f"step: {gap:+.2f} s", flush=True)
        wait_idle(slurm)
    gaps = [h - d for h, d in zip(times["hrmctl"], times["hand"])]
    hr, hd = statistics.median(times["hrmctl"]), statistics.median(times["hand"])
    print(f"median to the first step: hrmctl train --slurm {hr:.2f} s, hand-written sbatch + srun torchrun {hd:.2f} s; "
          f"hrmctl's own: {hr - hd:+.2f} s (target <= +1 s)")
    print(f"median of the rounds' gaps: {statistics.median(gaps):+.2f} s; without round 1 (a first launch of these "
          f"overrides on this machine: the model-size estimate computed): "
          f"{statistics.median(gaps[1:]) if len(gaps) > 1 else float('nan'):+.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
