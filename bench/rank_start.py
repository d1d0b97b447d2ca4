"""What forking the ranks from torchrun's agent saves the suite (lab/forked_ranks.py, the suite's start-up), against
the product's way in the same run: torchrun's own, a new interpreter a rank (the checkout alone on PYTHONPATH).

Each launch is what a node runs: ``python -m node torchrun -- --standalone --nproc_per_node N -m
auralm.training.train`` on the tiny sudoku model for one step, on this machine. The two ways alternate, REPEAT
launches each; measured per launch: the CPU seconds of the agent and its ranks together (RUSAGE_CHILDREN) and the
wall time. Prints the medians and the ratios (forked / new interpreters).

Usage: python bench/rank_start.py [--ranks 2] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TRAIN = ["model=tiny", "training.max_steps=1", "training.batch_size=8", "training.log_interval=1",
         "training.checkpoint_interval=0", "training.eval_interval=0", "training.eval_batches=1",
         "logging.curves=false"]


def launch(ranks: int, data: Path, out: Path, forked: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one launch."""
    path = [str(REPO), str(REPO / "lab" / "site")] if forked else [str(REPO)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), HRMCTL_BACKEND="gloo")
    cmd = [sys.executable, "-m", "node", "torchrun", "--", "--standalone", "--nproc_per_node", str(ranks),
           "-m", "auralm.training.train", *TRAIN, f"data_dir={data}", f"out_dir={out}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode:
        raise SystemExit(f"launch failed ({res.returncode}): {res.stderr[-800:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from auralm.data.datadir import prepare_sudoku  # noqa: PLC0415 - after sys.path

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sudoku"
        prepare_sudoku(data, count=600, seed=1, min_givens=50, max_givens=60)
        got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for i in range(args.repeat):
            for forked in (False, True):
                got[forked].append(launch(args.ranks, data, Path(tmp) / f"run-{forked}-{i}", forked))
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v)) for k, v in got.items()}
    for forked, name in ((False, "new interpreters"), (True, "forked")):
        cpu, wall = med[forked]
        print(f"{name:17s} {cpu:6.2f} CPU-s  {wall:6.2f} s wall  (median of {args.repeat}, {args.ranks} ranks)")
    cpu_ratio, wall_ratio = med[True][0] / med[False][0], med[True][1] / med[False][1]
    print(f"forked / new interpreters: CPU {cpu_ratio:.2f}, wall {wall_ratio:.2f}; "
          f"{(med[False][0] - med[True][0]) / args.ranks:.2f} CPU-s less a rank")


if __name__ == "__main__":
    main()
