"""Time from `hrmctl train --slurm` to the first training step, against a hand-written sbatch script whose
`srun` starts the same torchrun on every node (what a cluster user writes today), on the same Slurm cluster,
alternated in the same run (target: hrmctl at most 1 s more).

The cluster is lab/slurm.py's (munged and slurmctld here, one slurmd in each of 2 lab nodes' namespaces). Both
runs train the same tiny model on the same data from the same directory (the shared file system), with the same
torchrun options and environment as hrmctl's plan (static rendezvous on the first node's address, gloo). The
clock starts when the submitting command starts (hrmctl, or sbatch for the hand-written script) and stops when
the trainer's metrics.jsonl gets its first step. hrmctl's cache (cli/cache.py) is new for each bench run, so its
round 1 is a user's first run: the overrides' check, the model's size and the nodes' torch facts all made anew.
hrmctl's extra is its own start inside the allocation, the
trainer's --check, and the preflight over srun (probes, directories, master port) before torchrun.

A second clock stops when the trainer's processes have started on both nodes (the later one's start time, read
from /proc: the lab's nodes share this machine's process table). From there to the first step is the trainer's
own work, the same on both sides (imports, model, data, the process group); on this 2-core machine it varies by
seconds from one start to the next, so the gap to the trainer's start is hrmctl's own part without that noise.

Root only. Usage: python bench/slurm.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

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


class TrainerStarts:
    """Watches the process table during one round for the trainer's processes (`-m auralm.training.train` under
    torchrun, not torchrun itself) and keeps their start times (wall clock, from /proc)."""

    def __init__(self) -> None:
        self.starts: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "TrainerStarts":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
                cmd = " ".join(proc.info["cmdline"] or ())
                if "auralm.training.train" in cmd and "torch.distributed.run" not in cmd and \
                        "-m node torchrun" not in cmd and proc.info["pid"] not in self.starts:
                    self.starts[proc.info["pid"]] = proc.info["create_time"]
            self._stop.wait(0.05)

    def both_started(self, wall0: float, nodes: int = 2) -> float:
        """Seconds from wall0 until the trainer had started on every node (the later of the first `nodes`)."""
        starts = sorted(self.starts.values())
        if len(starts) < nodes:
            raise RuntimeError(f"saw {len(starts)} trainer process(es), expected {nodes}")
        return starts[nodes - 1] - wall0


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


def hrmctl_run(slurm: LabSlurm, work: Path, data: Path, run: str) -> tuple[float, float]:
    with TrainerStarts() as seen:
        t0, wall0 = time.perf_counter(), time.time()
        subprocess.run([sys.executable, "-m", "cli", "train", "--slurm", "--nodes", "2", "--run-id", run, *TRAIN,
                        f"data_dir={data}"], check=True, cwd=work, env=user_env(slurm), capture_output=True)
        first = first_step(work / "runs" / run, t0)
    return first, seen.both_started(wall0)


def hand_run(slurm: LabSlurm, work: Path, data: Path, run: str) -> float:
    out = work / "runs" / run
    out.mkdir(parents=True)
    script = out / "hand.sbatch"
    script.write_text(HAND.format(out=out, python=sys.executable, run=run, args=" ".join([*TRAIN, f"data_dir={data}"])))
    with TrainerStarts() as seen:
        t0, wall0 = time.perf_counter(), time.time()
        subprocess.run(["sbatch", "--parsable", str(script)], check=True, cwd=work, env=user_env(slurm),
                       capture_output=True)
        first = first_step(out, t0)
    return first, seen.both_started(wall0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    from tests.trainer.helpers import small_sudoku

    first: dict[str, list[float]] = {"hrmctl": [], "hand": []}
    started: dict[str, list[float]] = {"hrmctl": [], "hand": []}
    with Lab(2, bare=True) as lab, LabSlurm(lab) as slurm, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["HRMCTL_CACHE"] = str(work / "cache")  # round 1 is a first run: nothing of hrmctl's cached
        data = small_sudoku(work / "sudoku", 1200)
        for i in range(args.repeat):
            for name, fn in (("hand", hand_run), ("hrmctl", hrmctl_run)):
                wait_idle(slurm)
                to_first, to_start = fn(slurm, work, data, f"{name}{i}")
                first[name].append(to_first)
                started[name].append(to_start)
            print(f"round {i + 1}: to the trainer's start hand {started['hand'][-1]:5.2f} s, hrmctl "
                  f"{started['hrmctl'][-1]:5.2f} s: {started['hrmctl'][-1] - started['hand'][-1]:+.2f} s | to the "
                  f"first step hand {first['hand'][-1]:5.2f} s, hrmctl {first['hrmctl'][-1]:5.2f} s: "
                  f"{first['hrmctl'][-1] - first['hand'][-1]:+.2f} s", flush=True)
        wait_idle(slurm)
    for label, times in (("to the trainer's start on both nodes", started), ("to the first step", first)):
        gaps = [h - d for h, d in zip(times["hrmctl"], times["hand"])]
        hr, hd = statistics.median(times["hrmctl"]), statistics.median(times["hand"])
        warm = f"{statistics.median(gaps[1:]):+.2f} s" if len(gaps) > 1 else "-"
        print(f"{label}: median hrmctl train --slurm {hr:.2f} s, hand-written sbatch + srun torchrun {hd:.2f} s: "
              f"{hr - hd:+.2f} s; median of the rounds' gaps {statistics.median(gaps):+.2f} s, without round 1 "
              f"{warm}; largest gap {max(gaps):+.2f} s (target <= +1 s)")
    own = [(f - s) for f, s in zip(first["hand"] + first["hrmctl"], started["hand"] + started["hrmctl"])]
    print(f"the trainer's own, from its start to the first step (both sides): {min(own):.2f}-{max(own):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
