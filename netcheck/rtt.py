"""Round-trip time and loss from this machine to a node: the system `ping` where it is allowed,
timed TCP connects otherwise (probe.tcp_rtt: a SYN-ACK or a RST both measure the round trip)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from node.probe import rtt_summary, tcp_rtt

_SENT = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received")
_RTT = re.compile(r"(?:rtt|round-trip) min/avg/max(?:/\w+)? = ([\d.]+)/([\d.]+)/([\d.]+)")


def parse_ping(text: str) -> dict | None:
    """iputils / busybox / BSD ping summary -> rtt dict, or None when it has no summary."""
    m = _SENT.search(text)
    if not m:
        return None
    sent, received = int(m.group(1)), int(m.group(2))
    r = _RTT.search(text)
    out = rtt_summary("", "ping", [], sent)
    out.update({"received": received, "loss_pct": round(100.0 * (sent - received) / sent, 1) if sent else None,
                "error": None if received else "no answer"})
    if r:
        out.update({"min_ms": float(r.group(1)), "avg_ms": float(r.group(2)), "max_ms": float(r.group(3))})
    return out


def ping_rtt(host: str, *, count: int = 10, tcp_port: int = 22, timeout: float = 1.0) -> dict:
    """RTT/loss to host: `ping` first; if ping is missing or not permitted, TCP connects to tcp_port."""
    ping = shutil.which("ping")
    if ping:
        interval = "0.05" if os.geteuid() == 0 else "0.2"  # below 0.2 s needs root
        argv = [ping, "-n", "-q", "-c", str(count), "-i", interval, "-W", str(max(1, int(timeout))), host]
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=count * 1.2 + timeout + 5)
            parsed = parse_ping(res.stdout) if res.returncode in (0, 1) else None
            if parsed is not None:
                parsed["target"] = host
                return parsed
        except (OSError, subprocess.SubprocessError):
            pass
    out = tcp_rtt(host, tcp_port, samples=min(count, 5), timeout=max(timeout, 2.0))
    return out
