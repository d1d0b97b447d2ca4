"""The benches' named links, each node's link shaped as one (LabNode.shape_link: HTB rate, netem or the NFQUEUE
delayer's delay with jitter, loss): the lab's LAN as it is, two wired links, and a crowded 2.4 GHz Wi-Fi."""

from __future__ import annotations

LINKS = {"LAN": (None, 0.0), "200M+3ms": (200, 3.0), "50M+20ms": (50, 20.0)}  # (Mbit/s, ms) on each node's link
WIFI = {"wifi": (50, 5.0, 2.5, 0.01)}  # (Mbit/s, ms, +- ms, loss) on each node's link: a crowded 2.4 GHz Wi-Fi
NAMES = (*LINKS, *WIFI)


def shape(lab, link: str) -> None:
    """Every node of ``lab`` on the link named ``link`` (the LAN: no shaping)."""
    rate, delay, jitter, loss = WIFI[link] if link in WIFI else (*LINKS[link], 0.0, 0.0)
    for node in lab.nodes:
        node.shape_link(rate, delay, jitter, loss)  # the LAN's (None, 0, ...): no shaping


def said(link: str) -> str:
    """The link in words, for a bench's first line."""
    if link in WIFI:
        rate, delay, jitter, loss = WIFI[link]
        return f"{link}: {rate} Mbit/s, {delay:g} +- {jitter:g} ms, {loss:.0%} loss on each node's link"
    rate, delay = LINKS[link]
    return link if rate is None else f"{link}: {rate} Mbit/s, +{delay:g} ms on each node's link"
