"""`hrmctl doctor`: probe every node in parallel, then the network between them; one report.

Per node, over ONE SSH connection and in parallel with every other node: the node probe
(node/probe.py, one `import torch`), the peer agent (node/peer.py) for clock samples by
Cristian's method, and from here a ping (or TCP) round-trip measure. Then, with the agents still
running, the master port (a listener on the master, a connect from every worker) and the full
mesh of random high ports, each direction graded by what the backend needs (netcheck.network_checks:
gloo dials one way per pair, NCCL both). Every failure on one node is a check of that node, never a crash.
`run_doctor(...)` returns a DoctorReport; cli/doctor/view.py renders it.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from netcheck import MasterAddressError, NodeProbe, ProbeError, master_address, run_probe
from netcheck.node_probe_client import probe_window
from netcheck.peer_agent_client import Agent, AgentError, start_agent
from netcheck.node_checks import FAIL, NODE_CHECKS, OK, SKIP, Check, longer_timeout, node_checks
from netcheck.consistency_checks import cluster_checks
from netcheck.backend import choose_backend
from netcheck.network_checks import (NET_CHECKS, MeshVerdict, clock_check, master_port_check, mesh_check, mesh_verdict,
                                     rtt_check)
from netcheck.clock import ClockSkew, measure_skew
from netcheck.ports import MeshResult, check_ports
from node.probe import is_loopback, resolve
from netcheck.rtt import ping_rtt

from cli.errors import HrmctlError
from cli.nodes.inventory import Node
from cli.nodes.remote import Session, connect

ROWS = ("ssh", *NODE_CHECKS, *NET_CHECKS)


@dataclass
class NodeReport:
    node: Node
    is_master: bool
    error: str | None = None            # could not connect
    probe: NodeProbe | None = None
    probe_error: str | None = None
    rtt_here: dict | None = None
    skew: ClockSkew | str | None = None
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)
    session: Session | None = None
    agent: Agent | None = None

    def as_dict(self) -> dict:
        return {
            "host": self.node.host, "master": self.is_master, "error": self.error, "probe_error": self.probe_error,
            "seconds": round(self.seconds, 3), "rtt_here": self.rtt_here,
            "rtt_to_master": (self.probe.raw.get("peer_rtt") if self.probe else None),
            "clock": self.skew.as_dict() if isinstance(self.skew, ClockSkew) else None,
            "checks": {c.name: c.as_dict() for c in self.checks},
            "probe": self.probe.as_dict() if self.probe else None,
            "probe_raw": self.probe.raw if self.probe else None,
        }


@dataclass
class DoctorReport:
    master: str
    master_address: str | None
    master_port: int
    nodes: list[NodeReport]
    cluster: list[Check]
    problems: list[str]
    seconds: float
    mesh: MeshVerdict | None = None     # every direction of the high-port mesh, graded for the backend

    def all_checks(self) -> list[Check]:
        return [c for r in self.nodes for c in r.checks] + self.cluster

    def counts(self) -> dict[str, int]:
        out = {OK: 0, "warn": 0, FAIL: 0, SKIP: 0}
        for c in self.all_checks():
            out[c.status] += 1
        return out

    @property
    def exit_code(self) -> int:
        return 1 if self.problems or any(c.status == FAIL for c in self.all_checks()) else 0


def _split(line: str) -> tuple[str, str | None]:
    """An error line "what; fix" -> (what, fix)."""
    if "; " in line:
        what, fix = line.split("; ", 1)
        return what, fix
    return line, None


def _ip_for(node: Node, probe: NodeProbe | None) -> str | None:
    if probe and probe.route_src and not is_loopback(probe.route_src):
        return probe.route_src
    try:
        return str(ipaddress.ip_address(node.host))
    except ValueError:
        addrs = [a for a in resolve(node.host) if not is_loopback(a)]
        return addrs[0] if addrs else None


def _gather(r: NodeReport, *, route_to: str | None, tcp_rtt: str | None, timeout: float,
            accept_new_host_keys: bool) -> None:
    """Connect, then in parallel: the agent (clock samples) and the probe. Fills r; never raises."""
    t0 = time.monotonic()
    try:
        r.session = connect(r.node, accept_new_host_keys=accept_new_host_keys, timeout=min(timeout, 10.0))
    except HrmctlError as exc:
        r.error, r.seconds = str(exc), time.monotonic() - t0
        return

    def agent_and_clock() -> None:
        try:
            r.agent = start_agent(r.session, timeout=timeout)
            r.skew = measure_skew(r.agent, samples=8, timeout=min(timeout, 10.0))
        except (AgentError, ValueError, HrmctlError) as exc:
            r.skew = str(exc)
        except Exception as exc:  # one node's surprise stays that node's failed check
            r.skew = f"{r.node.name}: {type(exc).__name__}: {exc}"

    th = threading.Thread(target=agent_and_clock, daemon=True)
    th.start()
    try:
        r.probe = run_probe(r.session, route_to=route_to, timeout=timeout, tcp_rtt=tcp_rtt,
                            within=probe_window(timeout))
    except ProbeError as exc:
        r.probe_error = str(exc)
    except Exception as exc:
        r.probe_error = f"{r.node.name}: {type(exc).__name__}: {exc}"
    th.join(timeout + 15)
    r.seconds = time.monotonic() - t0


def _ping(r: NodeReport, count: int) -> None:
    if r.node.is_local:
        return
    try:
        r.rtt_here = ping_rtt(r.node.host, count=count, tcp_port=r.node.port)
    except Exception as exc:
        r.rtt_here = {"error": f"{type(exc).__name__}: {exc}", "sent": 0, "method": "ping"}


DEFAULT_TIMEOUT_S = 120.0  # a cold laptop's first import of torch can take a minute; a healthy node answers in seconds


def run_doctor(nodes: list[Node], *, master_port: int = 29500, timeout: float = DEFAULT_TIMEOUT_S,
               accept_new_host_keys: bool = False, ping_count: int = 10, mesh: bool = True) -> DoctorReport:
    t_start = time.monotonic()
    master, peers = nodes[0], nodes[1:]
    multi = len(nodes) > 1
    reports = [NodeReport(n, is_master=(i == 0)) for i, n in enumerate(nodes)]
    problems: list[str] = []
    try:
        maddr: str | None = master_address(master.host, master_is_local=master.is_local,
                                           peer_hosts=[p.host for p in peers], master_name=master.name)
    except MasterAddressError:
        maddr = None  # decided again below, with the master's probe
    route_to = maddr or (None if master.is_local else master.host)
    rtt_target = f"{maddr or master.host}:{22 if master.is_local else master.port}"

    with ThreadPoolExecutor(max_workers=2 * len(nodes)) as pool:
        futs = [pool.submit(_gather, r, route_to=route_to if multi else None,
                            tcp_rtt=rtt_target if (multi and not r.is_master) else None,
                            timeout=timeout, accept_new_host_keys=accept_new_host_keys) for r in reports]
        futs += [pool.submit(_ping, r, ping_count) for r in reports]
        for f in futs:
            f.result()
    mrep = reports[0]
    if mrep.error:
        problems.append(f"the master {master.name} is unreachable: {mrep.error}")
    if multi and maddr is None:
        try:
            maddr = master_address(master.host, master_is_local=master.is_local, peer_hosts=[p.host for p in peers],
                                   master_probe=mrep.probe, master_name=master.name)
        except MasterAddressError as exc:
            problems.append(str(exc))

    try:
        mres = _network(reports, maddr, master_port, mesh=mesh and multi, timeout=min(timeout, 3.0))
    finally:
        for r in reports:
            if r.agent:
                r.agent.close()
            if r.session:
                r.session.close()
    answered = {r.node.name: r.probe for r in reports if r.probe}
    verdict = _mesh_verdict(mres, answered)
    for r in reports:
        r.checks = _node_rows(r, multi, mres, verdict, timeout)
    cluster = cluster_checks(answered) if answered else []
    if not any(r.session or r.probe for r in reports):
        first = next((r.error for r in reports if r.error), "no answer")
        raise HrmctlError(f"none of the nodes {', '.join(n.name for n in nodes)} could be reached ({first})", 3)
    return DoctorReport(master=master.name, master_address=maddr, master_port=master_port, nodes=reports,
                        cluster=cluster, problems=problems, seconds=time.monotonic() - t_start, mesh=verdict)


def _mesh_verdict(mres: MeshResult | None, probes: dict[str, NodeProbe]) -> MeshVerdict | None:
    """The mesh graded for the backend the world would get (gloo unless every node has CUDA and NCCL)."""
    if mres is None:
        return None
    backend = choose_backend(probes)[0] if probes else "gloo"
    info = {n: {"kind": p.os_kind, "python": (p.raw.get("python") or {}).get("executable")} for n, p in probes.items()}
    return mesh_verdict(mres, backend, info)


def _network(reports: list[NodeReport], maddr: str | None, port: int, *, mesh: bool, timeout: float) -> MeshResult | None:
    master = reports[0]
    agents = {r.node.name: r.agent for r in reports if r.agent}
    if not agents or (maddr is None and len(reports) > 1):
        return None
    addresses = {}
    for r in reports:
        if r.agent:
            ip = maddr if r.is_master and maddr else _ip_for(r.node, r.probe)
            if ip:
                addresses[r.node.name] = ip
    agents = {n: a for n, a in agents.items() if n in addresses}
    has_master = master.node.name in agents
    if not has_master and not mesh:
        return None
    return check_ports(agents, addresses, master=master.node.name, master_port=port if has_master else None,
                       mesh=mesh, timeout=timeout)


def _node_rows(r: NodeReport, multi: bool, mres: MeshResult | None, verdict: MeshVerdict | None,
               timeout: float | None = None) -> list[Check]:
    n = r.node
    if r.error:
        what, fix = _split(r.error)
        rows = [Check("ssh", FAIL, what, fix)]
        rows += [Check(name, SKIP, "not reached") for name in ROWS[1:]]
        if r.rtt_here:
            rows[ROWS.index("reach")] = rtt_check("reach", "from here", r.rtt_here)
        if not r.is_master and mres and mres.master_port:
            rows[ROWS.index("master port")] = Check("master port", FAIL, "not reached", None)
        return rows
    how = {"local": "local", "srun": f"{r.seconds:.1f}s srun (Slurm job {n.slurm_job})"}
    rows = [Check("ssh", OK, how.get(n.reached_by, f"{r.seconds:.1f}s {n.user}@{n.host}:{n.port}"))]
    if r.probe:
        rows += node_checks(r.probe, n, multi, timeout)
    else:
        # the probe is run by the node's Python: its failure (not found, timeout, garbage) is that row's
        what, fix = _split(r.probe_error or "no answer")
        if "did not finish in" in what:  # the session stopped it: even its window was not enough
            fix = longer_timeout(timeout)
        rows += [Check("python", FAIL, what, fix or f"check that `{n.python}` runs on {n.name} (python = in the inventory)")
                 if name == "python" else Check(name, SKIP, "no probe answer") for name in NODE_CHECKS]
    rows.append(rtt_check("reach", "from here", r.rtt_here) if not n.is_local else Check("reach", OK, "this machine"))
    peer = r.probe.raw.get("peer_rtt") if r.probe else None
    rows.append(rtt_check("to master", "to the master", peer) if not r.is_master and multi
                else Check("to master", SKIP, "is the master" if r.is_master else "single node"))
    rows.append(clock_check(r.skew))
    rows.append(master_port_check(n.name, r.is_master, mres.master_port if mres else None))
    rows.append(mesh_check(n.name, verdict) if verdict else Check("mesh", SKIP, "not checked" if multi else "single node"))
    return rows
