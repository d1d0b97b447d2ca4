"""What an `hrmctl` process costs before it does anything: the command line's fixed start-up.

    python bench/cli_startup.py [--repeat 15]

Each command runs --repeat times as a new process; the figures are medians of its wall time and of its
CPU time (user + system: steadier than wall time on a busy machine), beside the peer `python -c pass`
(the interpreter's own start, the floor no Python CLI goes below). The no-op `sync-data` against
`rsync -a` over SSH, the figure the CLI's start-up decides, is measured on a lab node by
bench/sync_vs_rsync.py.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed(argv: list[str], cwd: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="bench-startup-")
    Path(work, "hrmctl.toml").write_text('[nodes.node1]\nhost = "192.0.2.1"\n')  # TEST-NET: never contacted
    hrmctl = [sys.executable, "-m", "cli"]
    cases = {
        "python -c pass (peer)": [sys.executable, "-c", "pass"],
        "hrmctl --help": hrmctl + ["--help"],
        "hrmctl train --help": hrmctl + ["train", "--help"],
        "hrmctl nodes --json": hrmctl + ["nodes", "--json"],
        "hrmctl sync-data (usage error)": hrmctl + ["sync-data"],
    }
    rows = {name: [] for name in cases}
    for _ in range(a.repeat):  # interleaved, so that a busy moment touches every case alike
        for name, argv in cases.items():
            rows[name].append(timed(argv, work))
    peer_cpu = statistics.median(c for _, c in rows["python -c pass (peer)"])
    print(f"{'command':34}{'wall ms':>9}{'cpu ms':>9}{'cpu over python':>17}")
    for name, runs in rows.items():
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        print(f"{name:34}{wall * 1e3:>9.0f}{cpu * 1e3:>9.0f}{(cpu - peer_cpu) * 1e3:>14.0f} ms")


if __name__ == "__main__":
    main()
