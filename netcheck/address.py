"""The master's address as the workers reach it: an IP, never loopback when there are other nodes."""

from __future__ import annotations

import ipaddress
from typing import Any

from node.probe import is_loopback, resolve, route_to


class MasterAddressError(ValueError):
    """No usable master address. str() is one line with the fix."""


def _ip(text: str | None) -> str | None:
    try:
        return str(ipaddress.ip_address(text)) if text else None
    except ValueError:
        return None


def master_address(master_host: str, *, master_is_local: bool, peer_hosts: list[str],
                   master_probe: Any = None, master_name: str = "master") -> str:
    """The IP the workers should use for MASTER_ADDR.

    master_host: the master node's host as in the inventory; master_is_local: the master is this
    machine (host localhost); peer_hosts: the workers' hosts; master_probe: the master's NodeProbe
    when there is one (its route_src toward a worker is the address workers reach).
    Order: an IP literal in the inventory; the master probe's route source; this machine's route
    toward the first worker (local master); the host name resolved here.
    """
    if not peer_hosts:
        if master_is_local:
            return "127.0.0.1"
        lit = _ip(master_host)
        return lit or (resolve(master_host) or ["127.0.0.1"])[0]
    candidates: list[tuple[str, str]] = []
    lit = _ip(master_host)
    if lit:
        candidates.append((lit, f"the inventory's host {master_host}"))
    src = getattr(master_probe, "route_src", None)
    if src:
        candidates.append((src, f"{master_name}'s route toward the workers"))
    if master_is_local:
        local = route_to(peer_hosts[0])
        if local.get("src"):
            candidates.append((local["src"], f"this machine's route to {peer_hosts[0]}"))
    elif not lit:
        for a in resolve(master_host):
            candidates.append((a, f"{master_host} resolved here"))
    for addr, _why in candidates:
        if not is_loopback(addr):
            return addr
    seen = ", ".join(f"{a} ({why})" for a, why in candidates) or f"{master_host} does not resolve"
    raise MasterAddressError(
        f"no address of the master {master_name} that other nodes can reach: {seen}; set host = \"<its LAN IP>\" "
        f"for {master_name} in the inventory"
    )
