"""test-ddp's all_reduce bus bandwidth between two nodes, against a plain torch.distributed loop
doing the same all_reduce on the same nodes in the same run (target: at least 0.95 of it at every
size: the self-test must measure the wire, not itself), and against raw TCP throughput between
the same nodes (the physical ceiling, reported).

The plain loop (bench/plain_allreduce.py) runs under the same torchrun line and environment that
hrmctl plans (taken from --dry-run), typed by hand over ssh, and measures the same way anyone
would: a warm-up op, an iteration count that fills --seconds (agreed across ranks), the slowest
rank's time. The two alternate, `--repeat` rounds in a rotating order, and each size's ratio is
given twice: of the medians over the rounds (the paired comparison), and of the best rounds (on
a shared machine anything else that runs lowers a bandwidth, so the best round is each tool's
least disturbed figure, as `timeit` takes the minimum; but one lucky round of either tool moves
it, so it is the noisier of the two).

In the lab, each node is pinned to a core of its own (its sshd, so everything started on it);
`--no-pin` lets both nodes use every core.

Usage: python bench/collectives.py [--repeat 15] [--seconds 0.5]       (root: a lab of 2 namespace nodes)
       python bench/collectives.py --inventory hrmctl.toml --nodes a,b   (two real machines; the project in
                                                                          each node's workdir, as hrmctl needs)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _handrun import InventoryNodes, Lab, address, hrmctl, pin_nodes, planned_commands, python_of, ssh_popen  # noqa: E402

TCP_BYTES = 512 * 2 ** 20
RECEIVER = ("import socket,sys,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            "s.bind(('0.0.0.0',29799));s.listen(1);print('ready',flush=True)\nc,_=s.accept();buf=bytearray(4<<20)\n"
            "n=c.recv_into(buf);t0=time.perf_counter()\nwhile n<{total}:\n    k=c.recv_into(buf)\n    if not k: break\n"
            "    n+=k\nprint('TCP',n/(time.perf_counter()-t0)/1e9,flush=True)")
SENDER = ("import socket\nc=socket.create_connection(('{ip}',29799));b=bytes(4<<20)\n"
          "for _ in range({total}//len(b)): c.sendall(b)\nc.close()")


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 2 ** 20 else f"{n >> 10} KiB"


def test_ddp(lab: Lab, names: list[str], cwd: Path, seconds: float) -> dict[int, float]:
    doc = json.loads(hrmctl(lab, "test-ddp", "--nodes", ",".join(names), "--json", "--seconds", str(seconds),
                            cwd=cwd).stdout)
    return {r["bytes"]: r["busbw_GBps"] for r in doc["result"]["bandwidth"]}


def plain(lab: Lab, names: list[str], cwd: Path, seconds: float, port: int) -> dict[int, float]:
    lines = planned_commands(lab, "test-ddp", ["--nodes", ",".join(names), "--master-port", str(port)], cwd)
    procs = {name: ssh_popen(lab, name, line.split(" -m auralm.planning.ddp_check")[0] + f" bench/plain_allreduce.py {seconds}")
             for name, line in lines.items()}
    outs = {name: p.communicate()[0] for name, p in procs.items()}
    rows = next((l.split("PLAIN ", 1)[1] for l in outs[names[0]].splitlines() if "PLAIN " in l), None)
    if rows is None:
        raise SystemExit(f"plain all_reduce failed: {outs[names[0]][-800:]}")
    return {r["bytes"]: r["busbw_GBps"] for r in json.loads(rows)}


def raw_tcp(lab: Lab, names: list[str]) -> float:
    src, dst = names[0], names[1]
    recv = ssh_popen(lab, dst, f"{python_of(lab, dst)} -c \"{RECEIVER.format(total=TCP_BYTES)}\"")
    assert "ready" in recv.stdout.readline()
    send = ssh_popen(lab, src, f"{python_of(lab, src)} -c \"{SENDER.format(ip=address(lab, dst), total=TCP_BYTES)}\"")
    send.communicate()
    out = recv.communicate()[0]
    return float(next(l for l in out.splitlines() if l.startswith("TCP")).split()[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)  # 7 rounds resolve about 5%, the size of the target
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--inventory", help="measure two real machines of this inventory instead of a lab")
    ap.add_argument("--nodes", default="node0,node1", help="with --inventory: the two nodes, the master first")
    ap.add_argument("--no-pin", action="store_true", help="lab: let both nodes use every core")
    args = ap.parse_args()
    names = args.nodes.split(",")
    lab = InventoryNodes(args.inventory, names) if args.inventory else Lab(2).up()
    if not args.inventory and not args.no_pin:
        pin_nodes(lab)
    try:
        cwd = Path(tempfile.mkdtemp(prefix="bench-coll-"))
        runs: dict[str, list[dict[int, float]]] = {"test-ddp": [], "plain": []}
        tcps = []
        for i in range(args.repeat):
            order = ["test-ddp", "plain"] if i % 2 == 0 else ["plain", "test-ddp"]
            for tool in order:
                runs[tool].append(test_ddp(lab, names, cwd, args.seconds) if tool == "test-ddp"
                                  else plain(lab, names, cwd, args.seconds, 29780 + i))
                print(f"round {i + 1} {tool:>8}: " + " ".join(f"{v:.3f}" for _, v in sorted(runs[tool][-1].items())),
                      file=sys.stderr, flush=True)
            tcps.append(raw_tcp(lab, names))
        best = {tool: {s: max(r[s] for r in rs) for s in rs[0]} for tool, rs in runs.items()}
        median = {tool: {s: statistics.median(r[s] for r in rs) for s in rs[0]} for tool, rs in runs.items()}
        tcp = statistics.median(tcps)
        where = f"nodes {args.nodes} of {args.inventory}" if args.inventory else "2 namespace nodes"
        print(f"all_reduce bus bandwidth, {where}, GB/s: best of {args.repeat} rounds "
              "(median in parentheses)")
        print(f"{'size':>8} {'test-ddp':>16} {'plain':>16} {'ratio':>14} {'raw TCP':>8}")
        worst, worst_median = 9.9, 9.9
        for size in sorted(best["test-ddp"]):
            ours, peer = best["test-ddp"][size], best["plain"][size]
            worst = min(worst, ours / peer)
            mo, mp = median["test-ddp"][size], median["plain"][size]
            worst_median = min(worst_median, mo / mp)
            print(f"{human(size):>8} {ours:7.3f} ({mo:6.3f}) {peer:7.3f} ({mp:6.3f}) {ours / peer:6.3f} ({mo / mp:5.2f})"
                  f" {tcp:8.3f}")
        for what, w in (("medians", worst_median), ("best rounds", worst)):
            print(f"worst ratio test-ddp/plain of the {what}: {w:.3f} (target >= 0.95) {'OK' if w >= 0.95 else 'MISSED'}")
        print(f"raw TCP {tcp:.2f} GB/s one way ({TCP_BYTES >> 20} MiB, python sockets)")
        return 0
    finally:
        lab.down()


if __name__ == "__main__":
    sys.exit(main())
