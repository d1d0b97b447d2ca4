"""Cost of the NaN guard per step: `auralm.training.train` with the guard against the same run without it.

    python bench/nan_guard_cost.py [--repeats 8] [--steps 40] [--worlds 1,2]

Sudoku task, `model=tiny`, batch 64 per rank, one thread per rank. For each world size (1: this
process; 2: two spawned ranks over gloo on this machine) the runs alternate guard on / guard off
`--repeats` times in the same processes. Rank 0 times its steps between optimizer steps (a global
optimizer hook) after the warmup, in CPU time and in wall time: CPU time is steady on a machine
shared with other jobs, wall time also holds the waiting in the guard's collective. Reported:
medians, and the median and range of the per-repeat cost. Target: at most 2%.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from auralm.data import datadir  # noqa: E402
from auralm.training import config, train

BATCH = 64
STAMPS: list[tuple[float, float]] = []  # (CPU, wall) time at every optimizer step in this process


def one_run(data_dir: Path, out: Path, guard: bool, steps: int, warmup: int) -> None:
    """Train; rank 0 writes its seconds per step (CPU and wall) to out/step_time.json."""
    STAMPS.clear()
    with contextlib.redirect_stdout(io.StringIO()):
        train.run(config.parse([f"data_dir={data_dir}", f"out_dir={out}", "model=tiny", f"training.batch_size={BATCH}",
                                f"training.max_steps={warmup + steps}", "training.log_interval=10",
                                "training.eval_interval=0", "training.eval_batches=1",
                                "training.checkpoint_interval=0", f"guard.enabled={guard}"]))
    if int(os.environ.get("RANK", 0)) == 0:
        (cpu0, wall0), (cpu1, wall1) = STAMPS[warmup - 1], STAMPS[-1]
        (out / "step_time.json").write_text(json.dumps({"cpu": (cpu1 - cpu0) / steps, "wall": (wall1 - wall0) / steps}))


def plan(tmp: Path, repeats: int) -> list[tuple[Path, bool]]:
    """Guard on and off in each repeat, the order flipping every repeat."""
    return [(tmp / f"run-{i}-{'on' if g else 'off'}", g)
            for i in range(repeats) for g in ((True, False) if i % 2 else (False, True))]


def rank_main(rank: int, world: int, base_port: int, data_dir: str, tmp: str, repeats: int, steps: int, warmup: int):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    torch.set_num_threads(1)
    register_optimizer_step_post_hook(lambda *_: STAMPS.append((time.process_time(), time.perf_counter())))
    for i, (out, guard) in enumerate(plan(Path(tmp), repeats)):
        os.environ["MASTER_PORT"] = str(base_port + i)  # a fresh store for every run
        one_run(Path(data_dir), out, guard, steps, warmup)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--worlds", default="1,2")
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-guard-"))
    data_dir = root / "sudoku"
    datadir.prepare_sudoku(data_dir, count=4000, seed=0, min_givens=50, max_givens=60)
    rows = []
    for world in map(int, a.worlds.split(",")):
        tmp = root / f"world{world}"
        args = (world, free_port(), str(data_dir), str(tmp), a.repeats, a.steps, a.warmup)
        if world == 1:
            rank_main(0, *args)
        else:
            mp.start_processes(rank_main, args=args, nprocs=world, start_method="spawn")
        times = {(o.name.split("-")[1], g): json.loads((o / "step_time.json").read_text()) for o, g in plan(tmp, a.repeats)}
        for clock in ("cpu", "wall"):
            on = [times[(str(i), True)][clock] for i in range(a.repeats)]
            off = [times[(str(i), False)][clock] for i in range(a.repeats)]
            costs = [(n / f - 1) * 100 for n, f in zip(on, off)]
            rows.append((world, clock, statistics.median(on), statistics.median(off), costs))
    print(f"\nsudoku, model=tiny, batch {BATCH} per rank, 1 thread per rank, {a.steps} timed steps after {a.warmup}, "
          f"{a.repeats} repeats of guard off/on")
    print(f"{'ranks':<7}{'clock':<7}{'guard on ms/step':>18}{'guard off ms/step':>19}{'cost (median)':>15}"
          f"{'[min, max] per repeat':>24}")
    for world, clock, on, off, costs in rows:
        print(f"{world:<7}{clock:<7}{on * 1000:>18.2f}{off * 1000:>19.2f}{statistics.median(costs):>14.2f}%"
              f"{f'[{min(costs):.1f}%, {max(costs):.1f}%]':>24}")
    print("target: cost <= 2%")


if __name__ == "__main__":
    main()
