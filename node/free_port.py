"""A port the master can listen on for torchrun's store: ``free_port [PORT ...]`` -> ``{"port": N}`` (or
``{"port": null}`` when none binds), one JSON line (node.lines).

The first of the given ports it can bind (as the TCPStore binds it); with none given, one of 20 picked at random
below the machine's ephemeral range and outside torchrun's defaults (``--avoid`` them), else any. Not an ephemeral one
first: between this choice and torchrun's listen, an outgoing connection of any process may take it as its own port
(EADDRINUSE, seen in CI). Client: cli/launch/preflight/prepare.py.
"""

import random
import socket

from node.lines import say

RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def candidates(avoid: range) -> list:
    """20 ports below the ephemeral range, outside ``avoid``, in random order."""
    try:
        with open(RANGE_FILE) as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    pool = [p for p in range(20000, 32768) if not low <= p <= high and p not in avoid]
    return random.sample(pool, min(20, len(pool)))


def first_free(ports: list):
    """The first of ``ports`` (then any, port 0) this machine lets a listener bind, or None."""
    for p in ports + [0]:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", p))
            return s.getsockname()[1]
        except OSError:
            pass
        finally:
            s.close()
    return None


def main(argv: list) -> int:
    """argv: ``[--avoid LOW-HIGH] [PORT ...]``."""
    avoid = range(0)
    if argv[:1] == ["--avoid"]:
        low, _, high = argv[1].partition("-")
        avoid, argv = range(int(low), int(high) + 1), argv[2:]
    ports = [int(a) for a in argv]
    say({"port": first_free(ports or candidates(avoid))})
    return 0
