"""test-ddp's all_reduce bus bandwidth between two nodes, against a plain torch.distributed loop
doing the same all_reduce on the same nodes in the same run (target: at least 0.95 of it at every
size: the self-test must measure the wire, not itself), and against raw TCP throughput between
the same nodes (the physical ceiling, reported).

The plain loop (bench/plain_allreduce.py) runs under the same torchrun line and environment that
hrmctl plans (taken from --dry-run), typed by hand over ssh. Runs are interleaved and repeated;
the best of each per size is kept (the machine is shared).

Root only (a lab of 2 real sshd nodes). Usage: python bench/collectives.py [--repeat 2] [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _handrun import Lab, hrmctl, planned_commands, ssh_popen  # noqa: E402

TCP_BYTES = 512 * 2 ** 20
RECEIVER = ("import socket,sys,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            "s.bind(('0.0.0.0',29799));s.listen(1);print('ready',flush=True)\nc,_=s.accept();buf=bytearray(4<<20)\n"
            "n=c.recv_into(buf);t0=time.perf_counter()\nwhile n<{total}:\n    k=c.recv_into(buf)\n    if not k: break\n"
            "    n+=k\nprint('TCP',n/(time.perf_counter()-t0)/1e9,flush=True)")
SENDER = ("import socket\nc=socket.create_connection(('{ip}',29799));b=bytes(4<<20)\n"
          "for _ in range({total}//len(b)): c.sendall(b)\nc.close()")


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 2 ** 20 else f"{n >> 10} KiB"


def test_ddp(lab: Lab, cwd: Path, seconds: float) -> dict[int, float]:
    doc = json.loads(hrmctl(lab, "test-ddp", "--nodes", "node0,node1", "--json", "--seconds", str(seconds),
                            cwd=cwd).stdout)
    return {r["bytes"]: r["busbw_GBps"] for r in doc["result"]["bandwidth"]}


def plain(lab: Lab, cwd: Path, seconds: float, port: int) -> dict[int, float]:
    lines = planned_commands(lab, "test-ddp", ["--nodes", "node0,node1", "--master-port", str(port)], cwd)
    procs = {name: ssh_popen(lab, name, line.split(" -m auralm.ddp_check")[0] + f" bench/plain_allreduce.py {seconds}")
             for name, line in lines.items()}
    outs = {name: p.communicate()[0] for name, p in procs.items()}
    rows = next((l.split("PLAIN ", 1)[1] for l in outs["node0"].splitlines() if "PLAIN " in l), None)
    if rows is None:
        raise SystemExit(f"plain all_reduce failed: {outs['node0'][-800:]}")
    return {r["bytes"]: r["busbw_GBps"] for r in json.loads(rows)}


def raw_tcp(lab: Lab) -> float:
    py = lab.python
    recv = ssh_popen(lab, "node1", f"{py} -c \"{RECEIVER.format(total=TCP_BYTES)}\"")
    assert "ready" in recv.stdout.readline()
    send = ssh_popen(lab, "node0", f"{py} -c \"{SENDER.format(ip=lab.node('node1').ip, total=TCP_BYTES)}\"")
    send.communicate()
    out = recv.communicate()[0]
    return float(next(l for l in out.splitlines() if l.startswith("TCP")).split()[1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=0.5)
    args = ap.parse_args()
    lab = Lab(2).up()
    try:
        cwd = Path(tempfile.mkdtemp(prefix="bench-coll-"))
        ours: dict[int, float] = {}
        peer: dict[int, float] = {}
        tcp = 0.0
        for i in range(args.repeat):
            for size, v in test_ddp(lab, cwd, args.seconds).items():
                ours[size] = max(ours.get(size, 0.0), v)
            for size, v in plain(lab, cwd, args.seconds, 29780 + i).items():
                peer[size] = max(peer.get(size, 0.0), v)
            tcp = max(tcp, raw_tcp(lab))
        print(f"all_reduce bus bandwidth, gloo, 2 namespace nodes (best of {args.repeat}), GB/s:")
        print(f"{'size':>8} {'test-ddp':>9} {'plain':>9} {'ratio':>6} {'raw TCP':>8}")
        worst = 9.9
        for size in sorted(ours):
            ratio = ours[size] / peer[size] if peer.get(size) else float("nan")
            worst = min(worst, ratio)
            print(f"{human(size):>8} {ours[size]:9.3f} {peer[size]:9.3f} {ratio:6.2f} {tcp:8.3f}")
        print(f"worst ratio test-ddp/plain: {worst:.2f} (target >= 0.95) {'OK' if worst >= 0.95 else 'MISSED'}; "
              f"raw TCP {tcp:.2f} GB/s one way ({TCP_BYTES >> 20} MiB, python sockets)")
        return 0
    finally:
        lab.down()


if __name__ == "__main__":
    sys.exit(main())
