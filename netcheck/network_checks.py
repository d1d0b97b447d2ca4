"""Network checks: round trips and loss, clock skew, the master port and the full mesh (by direction)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from .node_checks import FAIL, OK, SKIP, WARN, Check
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


# ------------------------------------------------------------------------------------------------------------
# The full mesh of random high ports, graded by direction and by what the backend needs.
#
# gloo (torch's ProcessGroupGloo, gloo/transport/tcp/device.cc `Device::isInitiator`) makes ONE connection per
# pair of ranks: the side whose address compares higher (IPv4: numerically) dials, the other listens. So a pair
# needs exactly one direction, higher -> lower, and the other one is never used. Checked on this project's lab:
# with node1 (.12) refusing all inbound, node0+node1 train (node1 dials node0) but node0+node1+node2 hang in
# the first collective (node2, .13, must dial node1).
# NCCL needs every direction: its bootstrap root (on rank 0) dials back every rank, each rank dials its ring
# neighbour, and the socket transport's senders dial their receivers, both ways round a ring or a tree. The
# trainer also keeps a gloo group under NCCL, which adds nothing beyond that.

GLOO_RULE = ("gloo makes one connection per pair, dialled by the node with the higher address "
             "(gloo's Device::isInitiator): a pair needs that one direction")
NCCL_RULE = ("NCCL needs every direction (its bootstrap dials back every rank from the master and round the "
             "ring; its socket transport's senders dial their receivers)")
HYPERV_VM = "{40E0AC32-46A5-438A-A0B2-2B479E8F2E90}"  # WSL's Hyper-V firewall VM creator id


def _ip_key(addr: str | None) -> tuple[int, int] | None:
    try:
        ip = ipaddress.ip_address((addr or "").split("%")[0])
    except ValueError:
        return None
    return ip.version, int(ip)


def needed_directions(a: str, b: str, addresses: dict[str, str], backend: str) -> set[tuple[str, str]]:
    """The directions (src, dst) of the pair {a, b} that training with `backend` connects."""
    if backend == "nccl":
        return {(a, b), (b, a)}
    ka, kb = _ip_key(addresses.get(a)), _ip_key(addresses.get(b))
    if ka is None or kb is None or ka[0] != kb[0] or ka == kb:
        return {(a, b), (b, a)}  # which side dials is not knowable from here (same address: the port decides)
    return {(a, b)} if ka > kb else {(b, a)}


@dataclass
class MeshVerdict:
    """Every direction of the mesh, which ones the backend needs, and whose firewall to fix.

    directions: {"from", "to", "ok", "ms", "error", "needed"}; closed_inbound: nodes no peer reached (their
    firewall drops inbound); closed_outbound: nodes that reached no peer while their peers are open; fixes:
    node to fix -> the one-line fix for it."""

    backend: str
    rule: str
    nodes: list[str]
    directions: list[dict]
    closed_inbound: list[str] = field(default_factory=list)
    closed_outbound: list[str] = field(default_factory=list)
    fixes: dict[str, str] = field(default_factory=dict)

    def blocked(self) -> list[dict]:
        return [d for d in self.directions if not d["ok"]]

    def broken(self) -> list[dict]:
        """The blocked directions that training needs: the first collective hangs on them."""
        return [d for d in self.directions if not d["ok"] and d["needed"]]

    def dead_pairs(self) -> list[tuple[str, str]]:
        bad = {(d["from"], d["to"]) for d in self.blocked()}
        return sorted({tuple(sorted(p)) for p in bad if (p[1], p[0]) in bad})

    @property
    def training_affected(self) -> bool:
        return bool(self.broken())

    def as_dict(self) -> dict:
        return {"backend": self.backend, "rule": self.rule, "directions": self.directions,
                "closed_inbound": self.closed_inbound, "closed_outbound": self.closed_outbound,
                "dead_pairs": [list(p) for p in self.dead_pairs()], "training_affected": self.training_affected,
                "fixes": self.fixes}


def _is_firewall(d: dict) -> bool:
    """A direction that failed in the network (not because the probe's own listener could not start)."""
    return not d["ok"] and "could not open a listener" not in (d["error"] or "")


def _sources(ips: list[str], all_ips: list[str]) -> list[str]:
    """What to allow from: the nodes' /24 when every node is in the same one, else each source address."""
    nets = set()
    for ip in all_ips:
        try:
            a = ipaddress.ip_address(ip)
        except ValueError:
            return sorted(set(ips))
        nets.add(ipaddress.ip_network(f"{a}/{24 if a.version == 4 else 64}", strict=False))
    return [str(next(iter(nets)))] if len(nets) == 1 else sorted(set(ips))


def _inbound_fix(node: str, srcs: list[str], info: dict) -> str:
    kind = (info or {}).get("kind") or "linux"
    python = (info or {}).get("python") or "python3"
    if kind in ("wsl2", "windows"):
        rule = (f"`New-NetFirewallRule -DisplayName 'hrmctl cluster' -Direction Inbound -Protocol TCP -LocalPort "
                f"1024-65535 -RemoteAddress {','.join(srcs)} -Action Allow`")
        if kind == "windows":
            return f"on {node} (PowerShell as Administrator): {rule}"
        return (f"on {node}'s Windows host (PowerShell as Administrator): {rule}, and let WSL's Hyper-V firewall "
                f"pass it: `Set-NetFirewallHyperVVMSetting -Name '{HYPERV_VM}' -DefaultInboundAction Allow` "
                "(and ufw inside the distro, if it is on)")
    if kind == "macos":
        return (f"on {node}: allow incoming connections for {python} (System Settings › Network › Firewall, or "
                f"`sudo /usr/libexec/ApplicationFirewall/socketfilterfw --add {python} --unblockapp {python}`)")
    ufw = " && ".join(f"sudo ufw allow proto tcp from {s} to any port 1024:65535" for s in srcs)
    fwd = " && ".join(f"sudo firewall-cmd --permanent --zone=trusted --add-source={s}" for s in srcs)
    return (f"on {node}: `{ufw}` (firewalld: `{fwd} && sudo firewall-cmd --reload`); or pin the ports gloo/NCCL "
            "listen on with `sudo sysctl net.ipv4.ip_local_port_range=\"50000 51000\"` on every node and open "
            "just that range")


def _outbound_fix(node: str, dsts: list[str], info: dict) -> str:
    kind = (info or {}).get("kind") or "linux"
    if kind in ("wsl2", "windows"):
        return (f"on {node} (PowerShell as Administrator): `New-NetFirewallRule -DisplayName 'hrmctl cluster out' "
                f"-Direction Outbound -Protocol TCP -RemoteAddress {','.join(dsts)} -Action Allow`")
    return f"on {node}: allow outgoing TCP to the other nodes (`" + " && ".join(
        f"sudo ufw allow out proto tcp to {d}" for d in dsts) + "`)"


def mesh_verdict(mesh: Any, backend: str = "gloo", node_info: dict[str, dict] | None = None) -> MeshVerdict | None:
    """Grade a MeshResult. backend: the backend the world gets ("gloo" or "nccl"); node_info: name ->
    {"kind": os kind, "python": executable}, for the fix commands. None when there is no pair."""
    if mesh is None or not mesh.pairs:
        return None
    node_info = node_info or {}
    addresses = getattr(mesh, "addresses", {}) or {}
    nodes: list[str] = []
    for s, d in mesh.pairs:
        for n in (s, d):
            if n not in nodes:
                nodes.append(n)
    needed: set[tuple[str, str]] = set()
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            needed |= needed_directions(a, b, addresses, backend)
    directions = []
    for (s, d), failure in mesh.pairs.items():
        ms = mesh.ms.get((s, d))
        directions.append({"from": s, "to": d, "ok": failure is None, "ms": None if ms is None else round(ms, 3),
                           "error": failure.split("; fix:")[0] if failure else None, "needed": (s, d) in needed})
    v = MeshVerdict(backend=backend, rule=NCCL_RULE if backend == "nccl" else GLOO_RULE, nodes=nodes,
                    directions=directions)
    for n in nodes:
        inbound = [d for d in directions if d["to"] == n]
        if inbound and all(_is_firewall(d) for d in inbound):
            v.closed_inbound.append(n)
    for n in nodes:
        outbound = [d for d in directions if d["from"] == n]
        if (len(outbound) >= 2 and all(_is_firewall(d) for d in outbound)
                and not any(d["to"] in v.closed_inbound for d in outbound)):
            v.closed_outbound.append(n)
    all_ips = [addresses[n] for n in nodes if n in addresses]
    for d in v.blocked():
        if not _is_firewall(d):
            continue
        target = _blame(v, d)
        if target in v.fixes:
            continue
        if target == d["from"]:
            dsts = [addresses.get(x["to"], x["to"]) for x in v.blocked() if x["from"] == target]
            v.fixes[target] = _outbound_fix(target, _sources(dsts, all_ips), node_info.get(target))
        else:
            srcs = [addresses.get(x["from"], x["from"]) for x in v.blocked() if x["to"] == target]
            v.fixes[target] = _inbound_fix(target, _sources(srcs, all_ips), node_info.get(target))
    return v


def _blame(v: MeshVerdict, d: dict) -> str:
    """The node whose firewall blocks direction d: a node that accepts no inbound at all, else one that
    opens no outbound at all, else the destination (inbound filtering is the common case)."""
    if d["to"] in v.closed_inbound:
        return d["to"]
    if d["from"] in v.closed_outbound:
        return d["from"]
    return d["to"]


def _arrow(d: dict) -> str:
    return f"{d['from']} -> {d['to']}"


def mesh_check(name: str, verdict: MeshVerdict | None) -> Check:
    """One node's view of the mesh: its blocked directions, whose firewall blocks them, and whether training
    with the backend is affected (fail: a direction it needs is blocked; warn: only unused ones are)."""
    if verdict is None or name not in verdict.nodes:
        return Check("mesh", SKIP, "not checked")
    peers = len(verdict.nodes) - 1
    bad_in = [d for d in verdict.blocked() if d["to"] == name]
    bad_out = [d for d in verdict.blocked() if d["from"] == name]
    if not bad_in and not bad_out:
        return Check("mesh", OK, f"both ways with all {peers} peer(s)")
    parts = []
    if name in verdict.closed_inbound:
        parts.append(f"{name} accepts no inbound TCP on high ports (from {', '.join(d['from'] for d in bad_in)}): "
                     "its firewall")
    elif bad_in:
        why = bad_in[0]["error"].split(" — ")[-1] if bad_in[0]["error"] else "blocked"
        parts.append(f"not reachable from {', '.join(d['from'] for d in bad_in)} ({why})")
    if name in verdict.closed_outbound:
        parts.append(f"{name} opens no outbound TCP to its peers: its firewall")
    elif bad_out:
        parts.append("cannot reach " + ", ".join(
            d["to"] + (f" ({d['to']}'s firewall)" if d["to"] in verdict.closed_inbound else "") for d in bad_out))
    mine = bad_in + bad_out
    dead = [p for p in verdict.dead_pairs() if name in p]
    if dead:
        parts.append("no direction works with " + ", ".join(p[0] if p[1] == name else p[1] for p in dead))
    broken = [d for d in mine if d["needed"]]
    backend = verdict.backend
    if broken:
        parts.append(f"{backend} needs {', '.join(_arrow(d) for d in broken)}: training hangs at the first collective")
        status = FAIL
    else:
        peers_hit = {d["to"] if d["from"] == name else d["from"] for d in mine}
        used = [d for d in verdict.directions if d["needed"] and d["ok"]
                and {d["from"], d["to"]} in ({name, p} for p in peers_hit)]
        parts.append(f"training with {backend} is not affected ({backend} dials {', '.join(_arrow(d) for d in used)}, "
                     "which works)" if used else f"training with {backend} is not affected")
        status = WARN
    targets = []
    for d in (broken or mine):
        if _is_firewall(d):
            t = _blame(verdict, d)
            if t not in targets:
                targets.append(t)
    fix = "; ".join(verdict.fixes[t] if t == name else
                    f"on {t}: open its firewall to the other nodes (the command is in {t}'s mesh row)"
                    for t in targets if t in verdict.fixes) or None
    if fix is None and any(not _is_firewall(d) for d in mine):
        fix = "a node could not open a listening port for the probe: check its open-file limit and free ports"
    return Check("mesh", status, "; ".join(parts), fix)


def _fix(line: str) -> str | None:
    return line.split("; fix: ", 1)[1] if "; fix: " in line else None


NET_CHECKS = ("reach", "to master", "clock", "master port", "mesh")  # the doctor's rows after the node's own
