"""Probe many nodes in parallel: the orchestration over SSH that netcheck leaves to cli.

    probe_nodes(nodes, *, master_host, timeout, accept_new_host_keys=False, rtt_port=None)
        -> dict[node name, netcheck.NodeProbe | netcheck.ProbeError]

master_host is the master's address as the workers reach it (netcheck.master_address); every
node reports its route toward it (route_ifname / route_src: what GLOO_SOCKET_IFNAME and
NCCL_SOCKET_IFNAME must name there; on the master itself, the interface holding that address).
One SSH connection and one `import torch` per node. A node that cannot be reached, times out or
answers garbage gives a ProbeError (one line naming the node); it never hides the others.
"""

from __future__ import annotations

from netcheck import NodeProbe, ProbeError, run_probe

from .inventory import Node
from .remote import Session, for_each


def probe_nodes(nodes: list[Node], *, master_host: str | None, timeout: float = 60,
                accept_new_host_keys: bool = False, rtt_port: int | None = None,
                connect_timeout: float | None = None) -> dict[str, NodeProbe | ProbeError]:
    master = nodes[0].name if nodes else None

    def one(session: Session) -> NodeProbe:
        tcp = f"{master_host}:{rtt_port}" if rtt_port and master_host and session.node.name != master else None
        return run_probe(session, route_to=master_host, timeout=timeout, tcp_rtt=tcp)

    outs = for_each(nodes, one, accept_new_host_keys=accept_new_host_keys,
                    connect_timeout=connect_timeout or min(timeout, 10.0))
    return {o.node.name: (o.value if o.ok else ProbeError(o.error)) for o in outs}
