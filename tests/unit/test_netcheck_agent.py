"""The node agent on this machine through a real local pipe: clock samples, listeners, connects."""

from __future__ import annotations

import socket

from cli.nodes.inventory import local_node
from cli.nodes.remote import connect
from netcheck.peer_agent_client import start_agent
from netcheck.clock import measure_skew
from netcheck.ports import check_ports


def test_agent_listens_connects_and_tells_time():
    node = local_node()
    with connect(node) as s:
        a = start_agent(s)
        b = start_agent(s)
        b.name = "other"
        try:
            skew = measure_skew(a, samples=5)
            # one clock on both ends: Cristian's method puts the offset within its error bound (half the best round
            # trip; a loaded machine's round trips are longer, and so is the bound)
            assert abs(skew.offset_ms) <= skew.error_ms + 0.01 and skew.samples == 5
            res = check_ports({"me": a, "other": b}, {"me": "127.0.0.1", "other": "127.0.0.1"}, master="me",
                              master_port=_free_port(), mesh=True, timeout=2)
            assert res.master_port.ok and res.master_port.workers == {"other": None}
            assert res.pairs == {("me", "other"): None, ("other", "me"): None}
        finally:
            a.close()
            b.close()


def test_busy_master_port_names_the_fix():
    node = local_node()
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        with connect(node) as s:
            with start_agent(s) as a, start_agent(s) as b:
                b.name = "w"
                res = check_ports({"m": a, "w": b}, {"m": "127.0.0.1", "w": "127.0.0.1"}, master="m",
                                  master_port=port, mesh=False, timeout=2)
    finally:
        busy.close()
    pc = res.master_port
    assert not pc.ok and f"port {port} is already in use on m" in pc.master_error and "--master-port" in pc.master_error
    assert pc.workers["w"].startswith("not tried")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
