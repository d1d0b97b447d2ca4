"""Wi-Fi-like latency (and loss) without netem: hold packets in user space with iptables NFQUEUE.

This kernel has no netem qdisc. Packets that an iptables rule sends to NFQUEUE wait in the kernel
until a user-space program gives a verdict; this one (pure Python, raw nfnetlink, no bindings)
accepts each packet `delay_ms` after it arrived (plus or minus up to `jitter_ms`, uniformly, as a crowded Wi-Fi's
retries and contention vary it; never before the packet ahead of it, so the queue keeps its order as a Wi-Fi link's
does), or drops it with probability `loss`.

Run it as root inside a node's namespace with a rule that queues the packets ARRIVING at the
node (holding outgoing ones stalls the sender's TCP):
    ip netns exec NS iptables -I INPUT -i eth0 -j NFQUEUE --queue-num 7 --queue-bypass
    ip netns exec NS python lab/nfq_delay.py --queue 7 --delay-ms 80 [--jitter-ms 10] [--loss 0.1]
`--queue-bypass` lets traffic through untouched when no delayer is bound. `delayed_inbound(lab_node,
...)` does all of it as a context manager for tests.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _msg(msg_type: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + body


def _attrs(data: bytes):
    off = 0
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        if length < 4:
            return
        yield kind & 0x7FFF, data[off + 4: off + length]
        off += (length + 3) & ~3


class Delayer:
    def __init__(self, queue: int, delay_s: float, loss: float, jitter_s: float = 0.0):
        self.queue, self.delay_s, self.loss, self.jitter_s = queue, delay_s, loss, jitter_s
        self.last = 0.0  # when the packet ahead is released: none goes before it
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, 0))
        self.heap: list[tuple[float, int, int]] = []
        self.cv = threading.Condition()
        self.seq = 0

    def _config(self, attrs: bytes) -> None:
        self.seq += 1
        self.sock.send(_msg(NFQNL_MSG_CONFIG, self.queue, attrs, NLM_F_REQUEST | NLM_F_ACK, self.seq))
        reply = self.sock.recv(65536)
        _, mtype, _, _, _ = struct.unpack_from("=IHHII", reply)
        if mtype == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", reply, 16)
            if err:
                raise OSError(-err, f"nfqueue config failed: {os.strerror(-err)}")

    def bind(self) -> None:
        self._config(_attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, 0)))
        self._config(_attr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META)))

    def verdict(self, packet_id: int, verdict: int) -> None:
        self.sock.send(_msg(NFQNL_MSG_VERDICT, self.queue, _attr(NFQA_VERDICT_HDR, struct.pack(">II", verdict, packet_id))))

    def releaser(self) -> None:
        while True:
            with self.cv:
                while not self.heap or self.heap[0][0] > time.monotonic():
                    self.cv.wait(None if not self.heap else max(0.0, self.heap[0][0] - time.monotonic()))
                _, packet_id, verdict = heapq.heappop(self.heap)
            self.verdict(packet_id, verdict)

    def run(self) -> None:
        self.bind()
        threading.Thread(target=self.releaser, daemon=True).start()
        print("ready", flush=True)
        while True:
            data = self.sock.recv(1 << 20)
            off = 0
            while off + 16 <= len(data):
                length, mtype, _, _, _ = struct.unpack_from("=IHHII", data, off)
                if length < 16:
                    break
                if mtype == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    for kind, payload in _attrs(data[off + 20: off + length]):
                        if kind == NFQA_PACKET_HDR:
                            (packet_id,) = struct.unpack_from(">I", payload)
                            verdict = NF_DROP if random.random() < self.loss else NF_ACCEPT
                            at = time.monotonic() + self.delay_s + random.uniform(-self.jitter_s, self.jitter_s)
                            with self.cv:
                                self.last = max(self.last, at)
                                heapq.heappush(self.heap, (self.last, packet_id, verdict))
                                self.cv.notify()
                off += (length + 3) & ~3


@contextmanager
def delayed_inbound(lab_node, delay_ms: float, loss: float = 0.0, queue: int = 7, match: list[str] | None = None):
    """Delay (and drop a share of) the packets arriving at lab_node's eth0, for real, while inside."""
    rule = ["INPUT", "-i", "eth0", *(match or []), "-j", "NFQUEUE", "--queue-num", str(queue), "--queue-bypass"]
    proc = subprocess.Popen(["ip", "netns", "exec", lab_node.ns, sys.executable, str(Path(__file__).resolve()),
                             "--queue", str(queue), "--delay-ms", str(delay_ms), "--loss", str(loss)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"nfq_delay did not start: {line} {proc.stderr.read()[-500:]}")
        lab_node.netns(["iptables", "-I", *rule])
        try:
            yield proc
        finally:
            lab_node.netns(["iptables", "-D", *rule], check=False)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except OSError:
            pass
        proc.wait(5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queue", type=int, default=7)
    p.add_argument("--delay-ms", type=float, default=50.0)
    p.add_argument("--loss", type=float, default=0.0)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    Delayer(a.queue, a.delay_ms / 1000.0, a.loss, a.jitter_ms / 1000.0).run()


if __name__ == "__main__":
    main()
