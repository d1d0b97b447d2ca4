"""Wall time of `hrmctl doctor` over 1, 2, 4, 8 namespace nodes vs the same node probe by plain ssh.

The peer, measured in the same run on the same nodes: OpenSSH's `ssh` to every node in parallel,
each running the very same probe (node/probe.py, sent by node.ship.program, through the node's Python, same arguments).
The nodes share this machine's cores, so absolute scaling measures the machine; the ratio
doctor / plain-ssh measures the tool (target: at most 1.3 at every size).

Root only (it makes a lab of real sshd nodes). Usage:
    python bench/doctor_scaling.py [--sizes 1,2,4,8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from netcheck.node_probe_client import probe_args  # noqa: E402
from node.ship import program  # noqa: E402
from lab.nodes import Lab  # noqa: E402


def run_doctor(lab: Lab, names: list[str]) -> float:
    env = dict(os.environ, HRMCTL_INVENTORY=str(lab.inventory))
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "cli", "doctor", "--json", "--nodes", ",".join(names)],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    dt = time.perf_counter() - t0
    doc = json.loads(res.stdout)
    bad = {n: [k for k, v in d["checks"].items() if v["status"] == "fail"] for n, d in doc["nodes"].items()}
    if any(bad.values()):
        raise SystemExit(f"doctor found failures on a healthy lab: {bad}")
    return dt


def run_plain_ssh(lab: Lab, names: list[str]) -> float:
    source = program("probe").encode()
    master_ip = lab.node(names[0]).ip
    procs = []
    t0 = time.perf_counter()
    for i, name in enumerate(names):
        n = lab.node(name)
        args = probe_args(route_to=master_ip if len(names) > 1 else None, workdir="~/hrmctl",
                          data_dir="~/hrmctl/data", tcp_rtt=f"{master_ip}:22" if i else None)
        remote = " ".join([lab.python, "-", *args]).replace("~/", "$HOME/")
        p = subprocess.Popen(["ssh", "-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
                              "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{n.user}@{n.ip}", remote],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(p)
    # every node gets its input at once (communicate() one after the other would serialise them)
    with ThreadPoolExecutor(max_workers=len(procs)) as pool:
        results = list(pool.map(lambda p: p.communicate(source), procs))
    dt = time.perf_counter() - t0
    for p, (out, err) in zip(procs, results):
        if p.returncode != 0 or not out.strip().startswith(b"{"):
            raise SystemExit(f"plain ssh probe failed: {err.decode()[-300:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    with Lab(max(sizes)) as lab:
        rows = []
        for k in sizes:
            names = [f"node{i}" for i in range(k)]
            run_plain_ssh(lab, names)  # warm the page cache for this many nodes
            d, s = [], []
            for _ in range(a.repeat):  # interleaved, so drifting machine load hits both alike
                s.append(run_plain_ssh(lab, names))
                d.append(run_doctor(lab, names))
            rows.append((k, statistics.median(d), statistics.median(s)))
            print(f"  {k} node(s): doctor {[round(x, 2) for x in d]}  plain ssh {[round(x, 2) for x in s]}",
                  file=sys.stderr, flush=True)
    print(f"{'nodes':>5} {'doctor s':>9} {'plain ssh s':>12} {'ratio':>6}  (median of {a.repeat}, target <= 1.3)")
    for k, d, s in rows:
        print(f"{k:>5} {d:>9.2f} {s:>12.2f} {d / s:>6.2f}" + ("" if d / s <= 1.3 else "  over target"))


if __name__ == "__main__":
    main()
