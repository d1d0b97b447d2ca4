"""Preflight probes and checks: what one node can do, and what nodes can do together.

The split (arrows point one way: cli uses netcheck and node, netcheck uses node and never imports cli):

- What runs on the nodes is node/ (node/probe.py: the probe's one JSON object; node/peer.py: the peer checks'
  line agent), sent there by node.ship.program; their clients are here.
- Run here on Session-like objects passed in by cli (duck typing: `.node` with name/python/workdir/
  data_path, `.run_python(code, args, timeout=)`, `.pipe(argv)` -- cli.nodes.remote.Session has them):
    node_probe_client.run_probe(session, route_to=, timeout=) -> NodeProbe      (raises ProbeError)
    ports.check_master_port(master_session, worker_sessions, address=, port=) -> PortCheck
    ports.check_ports(agents, addresses, master=, master_port=)         (master port + mesh)
    clock.measure_skew(agent) -> ClockSkew                              (Cristian's method)
- Pure, local:
    address.master_address(master_host, master_is_local=, peer_hosts=, master_probe=) -> IP
    rtt.ping_rtt(host) / node.probe.tcp_rtt(host, port): RTT and loss from here
    checks: ok / warn / fail rows, each with a one-line fix: node_checks (one node's facts), network_checks
               (round trips, clock, master port, mesh), consistency_checks (the same torch, commit, data)
    network_checks.mesh_verdict(mesh, backend) -> MeshVerdict: every direction of the high-port mesh, which
               ones the backend needs (gloo: one per pair, dialled from the higher address; NCCL: all),
               and whose firewall to fix

Probing many nodes in parallel (connect, run the probe, one result per node) is orchestration
over SSH and lives in cli (the doctor's run, the launcher's facts).
"""

from .address import MasterAddressError, master_address
from .node_probe_client import NodeProbe, ProbeError, parse_probe, probe_args, run_probe
from .ports import PortCheck, check_master_port

__all__ = [
    "MasterAddressError", "NodeProbe", "PortCheck", "ProbeError", "check_master_port", "master_address",
    "parse_probe", "probe_args", "run_probe",
]
