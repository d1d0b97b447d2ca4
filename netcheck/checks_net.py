"""Network checks: round trips and loss, clock skew, the master port and the full mesh."""

from __future__ import annotations

from typing import Any

from .checks import FAIL, OK, SKIP, WARN, Check
from .clock import FAIL_S, WARN_S

RTT_WARN_MS = 30.0     # Wi-Fi is typically 2-10 ms; above this every collective waits
LOSS_WARN_PCT = 1.0
LOSS_FAIL_PCT = 20.0


def rtt_check(name: str, label: str, rtt: dict | None) -> Check:
    if not rtt:
        return Check(name, SKIP, "not measured")
    method = rtt.get("method", "?")
    if rtt.get("received", 0) == 0 and rtt.get("sent"):
        return Check(name, FAIL, f"{label}: no answer to {rtt['sent']} {method} probes",
                     "check that the node is up and no firewall drops its traffic")
    if rtt.get("error") and rtt.get("avg_ms") is None:
        return Check(name, FAIL, f"{label}: {rtt['error']}", "check the node's address and network")
    loss = rtt.get("loss_pct") or 0.0
    detail = f"{rtt['avg_ms']:.1f} ms, {loss:g}% loss ({method}, min {rtt['min_ms']:.1f})"
    if loss >= LOSS_FAIL_PCT:
        return Check(name, FAIL, detail, "the link drops packets: use a cable or a closer access point (5 GHz), "
                     "check `ip -s link` for errors")
    if loss > LOSS_WARN_PCT or rtt["avg_ms"] > RTT_WARN_MS:
        return Check(name, WARN, detail, "slow or lossy link: collectives will stall; prefer Ethernet or a closer "
                     "5 GHz access point, and turn off Wi-Fi power saving (`iw dev <if> set power_save off`)")
    return Check(name, OK, detail)


def clock_check(skew: Any) -> Check:
    if skew is None:
        return Check("clock", SKIP, "not measured")
    if isinstance(skew, str):
        return Check("clock", FAIL, skew, "check that the node's python runs and the SSH session stays up")
    off = skew.offset_ms
    detail = f"{off:+.1f} ms (±{skew.error_ms:.1f})"
    fix = ("turn on time sync on the node: `sudo timedatectl set-ntp true` (WSL2 after sleep: `sudo hwclock -s`; "
           "Windows: `w32tm /resync`)")
    if abs(off) >= FAIL_S * 1000:
        return Check("clock", FAIL, detail + ": breaks c10d rendezvous keep-alives", fix)
    if abs(off) >= WARN_S * 1000:
        return Check("clock", WARN, detail + ": logs come out of order", fix)
    return Check("clock", OK, detail)


def master_port_check(name: str, is_master: bool, pc: Any) -> Check:
    if pc is None:
        return Check("master port", SKIP, "not checked")
    if is_master:
        if pc.master_error:
            return Check("master port", FAIL, pc.master_error.split(";")[0], _fix(pc.master_error))
        return Check("master port", OK, f"{pc.port} free on {pc.address}")
    failure = pc.workers.get(name, "not checked")
    if failure is None:
        ms = pc.ms.get(name)
        return Check("master port", OK, f"reaches :{pc.port}" + (f" ({ms:.1f} ms)" if ms is not None else ""))
    return Check("master port", FAIL, failure.split("; fix:")[0], _fix(failure))


def mesh_check(name: str, mesh: Any, n_nodes: int) -> Check:
    if mesh is None or n_nodes < 2:
        return Check("mesh", SKIP, "single node")
    bad_out = [(s, d, f) for (s, d), f in mesh.pairs.items() if s == name and f]
    bad_in = [(s, d, f) for (s, d), f in mesh.pairs.items() if d == name and f]
    total = n_nodes - 1
    if not bad_out and not bad_in:
        return Check("mesh", OK, f"both ways with all {total} peer(s)")
    parts = []
    if bad_out:
        parts.append("cannot reach " + ", ".join(d for _, d, _ in bad_out))
    if bad_in:
        parts.append("not reachable from " + ", ".join(s for s, _, _ in bad_in))
    fix = ("a firewall passes the master port but not the random high ports gloo/NCCL use after rendezvous: on "
           f"{name} allow TCP from the cluster's subnet (`sudo ufw allow from <LAN subnet>`), or pin the range with "
           "`sysctl net.ipv4.ip_local_port_range=\"50000 51000\"` on every node and open just that range")
    first = (bad_in or bad_out)[0][2]
    return Check("mesh", FAIL, "; ".join(parts) + f" ({first.split(' — ')[-1].split(';')[0]})", fix)


def _fix(line: str) -> str | None:
    return line.split("; fix: ", 1)[1] if "; fix: " in line else None


NET_CHECKS = ("reach", "to master", "clock", "master port", "mesh")
