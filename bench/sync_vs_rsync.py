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

from cli.inventory import load_inventory  # noqa: E402
from cli.sync import sync_nodes  # noqa: E402
from tests.lab import Lab  # noqa: E402

TOOLS = ("hrmctl", "library", "rsync")


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
        self.nodes = load_inventory(lab.inventory).select(node_name)

    def dest(self, tool: str, name: str) -> tuple[str, Path]:
        """(path as given to the tool, path as seen from here)."""
        return f"bench-{tool}-{name}", self.node.home / f"bench-{tool}-{name}"

    def clear(self, tool: str, name: str) -> None:
        shutil.rmtree(self.dest(tool, name)[1], ignore_errors=True)

    def run(self, tool: str, src: Path, name: str) -> float:
        rel, _ = self.dest(tool, name)
        if tool == "library":  # what `hrmctl train --sync-data` pays: no process start, no imports
            t0 = time.perf_counter()
            report = sync_nodes(self.nodes, src, dest=f"~/{rel}", progress=False)
            seconds = time.perf_counter() - t0
            if not report.ok:
                raise SystemExit(f"sync_nodes failed: {report.nodes[0].error}")
            return seconds
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
    full: dict[str, list[float]] = {t: [] for t in TOOLS}
    noop: dict[str, list[float]] = {t: [] for t in TOOLS}
    for i in range(repeat):
        for tool in TOOLS[i % len(TOOLS):] + TOOLS[:i % len(TOOLS)]:  # rotate the order every round
            tools.clear(tool, name)
            subprocess.run(["sync"], check=False)
            full[tool].append(tools.run(tool, src, name))
            noop[tool].append(tools.run(tool, src, name))
            if not same_tree(src, tools.dest(tool, name)[1]):
                raise SystemExit(f"{tool} left a different tree for {name}")
    size = tree_bytes(src)
    med = {k: statistics.median(v) for k, v in full.items()}
    nmed = {k: statistics.median(v) for k, v in noop.items()}
    for tool in TOOLS:
        tools.clear(tool, name)
    return {
        "dataset": name, "bytes": size, "files": sum(1 for p in src.rglob("*") if p.is_file()),
        "full_s": med, "full_MBps": {k: size / v / 1e6 for k, v in med.items()}, "noop_s": nmed,
        "throughput_ratio": {k: med["rsync"] / med[k] for k in TOOLS if k != "rsync"},
        "noop_ratio": {k: nmed[k] / nmed["rsync"] for k in TOOLS if k != "rsync"},
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
    print(f"sync-data vs rsync -a over ssh, same lab node, medians of {args.repeat}; ratios against rsync")
    print("  hrmctl  = the CLI (`hrmctl sync-data`, a new process: Python start and imports included)")
    print("  library = cli.sync.sync_nodes() in a running process (what `hrmctl train --sync-data` pays)")
    print(f"{'dataset':24} {'tool':8} {'full copy':>10} {'MB/s':>7} {'ratio':>6}  {'no-op':>7} {'ratio':>6}")
    for r in results:
        for tool in TOOLS:
            tr = r["throughput_ratio"].get(tool)
            nr = r["noop_ratio"].get(tool)
            mark1 = "" if tr is None else f"{tr:6.2f}" + (" ok" if tr >= 0.9 else " MISSED (>=0.9)")
            mark2 = "" if nr is None else f"{nr:6.2f}" + (" ok" if nr <= 1.5 else " MISSED (<=1.5)")
            print(f"{r['dataset']:24} {tool:8} {r['full_s'][tool]:9.2f}s {r['full_MBps'][tool]:7.1f} {mark1:21} "
                  f"{r['noop_s'][tool]:6.2f}s {mark2}")


if __name__ == "__main__":
    main()
