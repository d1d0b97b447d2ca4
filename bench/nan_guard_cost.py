"""Cost of the NaN guard per step: `auralm.train` with the guard against the same run without it.

    python bench/nan_guard_cost.py [--repeats 5] [--steps 40] [--worlds 1,2]

Sudoku task, `model=tiny`, batch 64. For each world size (1: this process; 2: two spawned ranks
over gloo on this machine) the runs alternate guard on / guard off `--repeats` times in the same
processes; each run's throughput is the trainer's own (metrics.jsonl, every logged interval after
the first). Reported: medians, the guard's cost in % and in ms per step. Target: at most 2%.
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
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from auralm import config, data, train  # noqa: E402

BATCH = 64


def one_run(data_dir: Path, out: Path, guard: bool, steps: int, warmup: int) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        train.run(config.parse([f"data_dir={data_dir}", f"out_dir={out}", "model=tiny", f"training.batch_size={BATCH}",
                                f"training.max_steps={warmup + steps}", f"training.log_interval={warmup}",
                                "training.eval_interval=0", "training.checkpoint_interval=0",
                                f"guard.enabled={guard}"]))


def samples_per_s(out: Path) -> float:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]  # after warmup
    return len(recs) / sum(1 / r["samples_per_s"] for r in recs)


def plan(tmp: Path, repeats: int) -> list[tuple[Path, bool]]:
    return [(tmp / f"run-{i}-{'on' if g else 'off'}", g) for i in range(repeats) for g in ((True, False) if i % 2 else (False, True))]


def rank_main(rank: int, world: int, base_port: int, data_dir: str, tmp: str, repeats: int, steps: int, warmup: int):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    torch.set_num_threads(1)
    for i, (out, guard) in enumerate(plan(Path(tmp), repeats)):
        os.environ["MASTER_PORT"] = str(base_port + i)
        one_run(Path(data_dir), out, guard, steps, warmup)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--worlds", default="1,2")
    a = p.parse_args()
    steps = a.steps - a.steps % a.warmup
    root = Path(tempfile.mkdtemp(prefix="bench-guard-"))
    data_dir = root / "sudoku"
    data.prepare_sudoku(data_dir, count=4000, seed=0, min_givens=50, max_givens=60)
    rows = []
    for world in map(int, a.worlds.split(",")):
        tmp = root / f"world{world}"
        if world == 1:
            for out, guard in plan(tmp, a.repeats):
                one_run(data_dir, out, guard, steps, a.warmup)
        else:
            mp.start_processes(rank_main, args=(world, free_port(), str(data_dir), str(tmp), a.repeats, steps,
                                                 a.warmup), nprocs=world, start_method="spawn")
        on = [samples_per_s(o) for o, g in plan(tmp, a.repeats) if g]
        off = [samples_per_s(o) for o, g in plan(tmp, a.repeats) if not g]
        costs = [(1 - n / f) * 100 for n, f in zip(on, off)]  # per repeat (one on and one off run each)
        rows.append((world, statistics.median(on), statistics.median(off), costs))
    print(f"\nsudoku, model=tiny, batch {BATCH} per rank, {steps} timed steps after {a.warmup}, "
          f"median of {a.repeats} alternating runs")
    print(f"{'ranks':<7}{'guard on puzzles/s':>20}{'guard off puzzles/s':>21}{'cost':>8}{'ms/step':>9}"
          f"{'per-repeat cost [min, max]':>29}")
    for world, on, off, costs in rows:
        per_step = (BATCH * world / on - BATCH * world / off) * 1000
        print(f"{world:<7}{on:>20.0f}{off:>21.0f}{(1 - on / off) * 100:>7.2f}%{per_step:>9.2f}"
              f"{f'[{min(costs):.1f}%, {max(costs):.1f}%]':>29}")
    print("target: cost <= 2%")


if __name__ == "__main__":
    main()
