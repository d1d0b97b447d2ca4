"""`hrmctl sync-data` against `rsync -a` over ssh, to the same namespace node, in the same run.

    python bench/sync_vs_rsync.py [--big-mb 500] [--shards 5] [--small 10000] [--repeat 3] [--only shards|small]

Two datasets: a few large shards (random bytes), and a tree of many small files. For each,
alternating the two tools, `--repeat` times: a full copy into an empty destination, then a
no-op resync. Both tools run as the user would run them (a fresh process, its own SSH
connection, the same key and known_hosts). Figures are medians; ratios are hrmctl / rsync:
throughput (targets: >= 0.9) and no-op time (target: <= 1.5). Root only (it makes a lab node).

The node's destinations are on a disk of its own (--node-disk ext4, the default): a new ext4
made by mkfs.ext4's defaults, with its journal, as a node's disk would be, on a loop device
mounted in the node's mount namespace. `--node-disk home` writes under the node's home on this
machine's own filesystem instead. Here that is an ext4 without a journal, where a file created
within a minute (five if not yet written back) of many deletions in the same block group costs
the kernel a scan past each deleted inode (fs/ext4/ialloc.c, recently_deleted): every round
deletes the last round's 10,000 files, so the small-file figures then measure that scan (0.15 s
to 1.1 s of system time per round, for either tool) more than the tools.
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

from cli.nodes.inventory import load_inventory  # noqa: E402
from cli.sync.run import sync_nodes  # noqa: E402
from lab.nodes import Lab  # noqa: E402

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


class NodeDisk:
    """A fresh ext4 image mounted at ~/disk in the node's mount namespace (its sshd's: `ip netns
    exec` gave it its own, so a mount made out here would not be seen there). `seen` is the
    same directory as this process sees it, through /proc/PID/root."""

    def __init__(self, node, work: Path, size: str = "4G"):
        self.ns = ["nsenter", "-t", str(node.sshd.pid), "-m"]
        self.image, self.mount = work / f"{node.name}-disk.img", node.home / "disk"
        self.seen = Path(f"/proc/{node.sshd.pid}/root") / str(self.mount).lstrip("/")
        self.mounted = False
        if shutil.which("mkfs.ext4") is None or shutil.which("nsenter") is None:
            raise SystemExit("mkfs.ext4 or nsenter is missing (apt-get install e2fsprogs util-linux), "
                             "or pass --node-disk home")
        subprocess.run(["truncate", "-s", size, str(self.image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], check=True)
        self.mount.mkdir(exist_ok=True)
        subprocess.run([*self.ns, "mount", "-o", "loop", str(self.image), str(self.mount)], check=True)
        self.mounted = True
        subprocess.run([*self.ns, "chown", f"{node.user}:{node.user}", str(self.mount)], check=True)

    def close(self) -> None:
        if self.mounted:
            subprocess.run([*self.ns, "umount", str(self.mount)], check=False)
            self.mounted = False
        self.image.unlink(missing_ok=True)


class Tools:
    def __init__(self, lab: Lab, node_name: str = "node0", disk: NodeDisk | None = None):
        self.lab, self.node = lab, lab.node(node_name)
        # (path as given to the tools, relative to the node's home; the same path as seen from here)
        self.base = ("disk/", disk.seen) if disk else ("", self.node.home)
        self.ssh = (f"ssh -i {lab.key} -o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
                    "-o BatchMode=yes")
        self.env = dict(os.environ, HRMCTL_INVENTORY=str(lab.inventory))
        self.nodes = load_inventory(lab.inventory).select(node_name)

    def dest(self, tool: str, name: str) -> tuple[str, Path]:
        """(path as given to the tool, path as seen from here)."""
        rel, seen = self.base
        return f"{rel}bench-{tool}-{name}", seen / f"bench-{tool}-{name}"

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
    ap.add_argument("--only", choices=("shards", "small"), help="run one of the two datasets")
    ap.add_argument("--node-disk", choices=("ext4", "home"), default="ext4",
                    help="where the node's copies go: a fresh ext4 of its own (default), or its home here")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is not installed: apt-get install rsync")
    work = Path(tempfile.mkdtemp(prefix="hrmctl-bench-"))
    results = []
    try:
        big, small = work / "shards", work / "small"
        if args.only != "small":
            make_big(big, args.big_mb, args.shards)
        if args.only != "shards":
            make_small(small, args.small)
        with Lab(1) as lab:
            disk = NodeDisk(lab.node("node0"), work) if args.node_disk == "ext4" else None
            try:
                tools = Tools(lab, disk=disk)
                if args.only != "small":
                    results.append(bench(tools, big, f"{args.shards} shards, {args.big_mb} MB", args.repeat))
                if args.only != "shards":
                    results.append(bench(tools, small, f"{args.small} small files", args.repeat))
            finally:
                if disk:
                    disk.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    where = "a fresh ext4 of its own" if args.node_disk == "ext4" else "its home on this machine's filesystem"
    print(f"sync-data vs rsync -a over ssh, same lab node ({where}), medians of {args.repeat}; ratios against rsync")
    print("  hrmctl  = the CLI (`hrmctl sync-data`, a new process: Python start and imports included)")
    print("  library = cli.sync.run.sync_nodes() in a running process (what `hrmctl train --sync-data` pays)")
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
