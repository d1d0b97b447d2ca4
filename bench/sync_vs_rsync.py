"""`hrmctl sync-data` against `rsync -a` over ssh, to the same namespace node, in the same run.

    python bench/sync_vs_rsync.py [--big-mb 500] [--shards 5] [--small 10000] [--repeat 3]

Two datasets: a few large shards (random bytes), and a tree of many small files. For each,
alternating the two tools, `--repeat` times: a full copy into an empty destination, then a
no-op resync. Both tools run as the user would run them (a fresh process, its own SSH
connection, the same key and known_hosts). Figures are medians; ratios are hrmctl / rsync:
throughput (targets: >= 0.9) and no-op time (target: <= 1.5). Root only (it makes a lab node).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.lab import Lab  # noqa: E402


def make_big(root: Path, total_mb: int, shards: int) -> None:
    root.mkdir(parents=True)
    size = total_mb * 1_000_000 // shards
    for i in range(shards):
        with open(root / f"train-{i:03d}.bin", "wb") as fh:
            left = size
            while left:
                n = min(left, 8 << 20)
                fh.write(os.urandom(n))
                left -= n


def make_small(root: Path, count: int) -> None:
    import random
    rng = random.Random(0)
    for i in range(count):
        d = root / f"part-{i // 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"sample-{i:05d}.json").write_bytes(os.urandom(rng.randint(200, 8000)))


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


class Tools:
    def __init__(self, lab: Lab, node_name: str = "node0"):
        self.lab, self.node = lab, lab.node(node_name)
        self.ssh = (f"ssh -i {lab.key} -o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
                    "-o BatchMode=yes")
        self.env = dict(os.environ, HRMCTL_INVENTORY=str(lab.inventory))

    def dest(self, tool: str, name: str) -> tuple[str, Path]:
        """(path as given to the tool, path as seen from here)."""
        return f"bench-{tool}-{name}", self.node.home / f"bench-{tool}-{name}"

    def clear(self, tool: str, name: str) -> None:
        shutil.rmtree(self.dest(tool, name)[1], ignore_errors=True)

    def run(self, tool: str, src: Path, name: str) -> float:
        rel, _ = self.dest(tool, name)
        if tool == "rsync":
            argv = ["rsync", "-a", "-e", self.ssh, f"{src}/", f"{self.node.user}@{self.node.ip}:{rel}/"]
        else:
            argv = [sys.executable, "-m", "cli", "sync-data", self.node.name, "--src", str(src),
                    "--dest", f"~/{rel}", "--json"]
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, cwd=ROOT)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{tool} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        return seconds


def same_tree(a: Path, b: Path) -> bool:
    files = lambda r: {str(p.relative_to(r)): p.stat().st_size for p in r.rglob("*") if p.is_file()}
    return files(a) == files(b)


def bench(tools: Tools, src: Path, name: str, repeat: int) -> dict:
    full = {"hrmctl": [], "rsync": []}
    noop = {"hrmctl": [], "rsync": []}
    for i in range(repeat):
        order = ("hrmctl", "rsync") if i % 2 == 0 else ("rsync", "hrmctl")
        for tool in order:
            tools.clear(tool, name)
            subprocess.run(["sync"], check=False)
            full[tool].append(tools.run(tool, src, name))
            noop[tool].append(tools.run(tool, src, name))
            if not same_tree(src, tools.dest(tool, name)[1]):
                raise SystemExit(f"{tool} left a different tree for {name}")
    size = tree_bytes(src)
    med = {k: statistics.median(v) for k, v in full.items()}
    nmed = {k: statistics.median(v) for k, v in noop.items()}
    for tool in ("hrmctl", "rsync"):
        tools.clear(tool, name)
    return {
        "dataset": name, "bytes": size, "files": sum(1 for p in src.rglob("*") if p.is_file()),
        "full_s": med, "full_MBps": {k: size / v / 1e6 for k, v in med.items()}, "noop_s": nmed,
        "throughput_ratio": med["rsync"] / med["hrmctl"], "noop_ratio": nmed["hrmctl"] / nmed["rsync"],
        "runs": {"full": full, "noop": noop},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--big-mb", type=int, default=500)
    ap.add_argument("--shards", type=int, default=5)
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed: apt-get install rsync")
    work = Path(tempfile.mkdtemp(prefix="hrmctl-bench-"))
    results = []
    try:
        big, small = work / "shards", work / "small"
        make_big(big, args.big_mb, args.shards)
        make_small(small, args.small)
        with Lab(1) as lab:
            tools = Tools(lab)
            results.append(bench(tools, big, f"{args.shards} shards, {args.big_mb} MB", args.repeat))
            results.append(bench(tools, small, f"{args.small} small files", args.repeat))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"sync-data vs rsync -a over ssh, same lab node, medians of {args.repeat} (ratios: hrmctl/rsync)")
    print(f"{'dataset':28} {'size':>9} {'hrmctl MB/s':>12} {'rsync MB/s':>11} {'ratio':>6} {'(>=0.9)':7}  "
          f"{'hrmctl no-op':>12} {'rsync no-op':>11} {'ratio':>6} {'(<=1.5)':7}")
    for r in results:
        ok1 = "ok" if r["throughput_ratio"] >= 0.9 else "MISSED"
        ok2 = "ok" if r["noop_ratio"] <= 1.5 else "MISSED"
        print(f"{r['dataset']:28} {r['bytes'] / 1e6:7.0f}MB {r['full_MBps']['hrmctl']:12.1f} "
              f"{r['full_MBps']['rsync']:11.1f} {r['throughput_ratio']:6.2f} {ok1:7}  "
              f"{r['noop_s']['hrmctl']:11.2f}s {r['noop_s']['rsync']:10.2f}s {r['noop_ratio']:6.2f} {ok2:7}")


if __name__ == "__main__":
    main()
