"""Ports between nodes: the master port (free on the master, reachable from every worker) and the
full mesh of random high ports that gloo and NCCL use after the rendezvous.

Both work on node agents (netcheck.peer_agent_client.Agent): listeners are opened by the agent on
the node and die with it; connects are made by the other nodes' agents, in parallel.
`check_master_port(master_session, worker_sessions, ...)` starts and closes the agents itself
(for the launcher's fast preflight); `doctor` reuses agents it already has.
"""

from __future__ import annotations

import errno
import secrets
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .peer_agent_client import Agent, AgentError, start_agent


@dataclass
class PortCheck:
    """master_error: the port cannot be opened on the master (None: it can);
    workers: worker name -> None (reached the master's listener) or a one-line failure with the fix."""

    master: str
    address: str
    port: int
    master_error: str | None = None
    workers: dict[str, str | None] = field(default_factory=dict)
    ms: dict[str, float | None] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.master_error is None and all(v is None for v in self.workers.values())

    def failures(self) -> list[str]:
        return ([self.master_error] if self.master_error else []) + [v for v in self.workers.values() if v]


def listen_error(node: str, port: int, res: dict) -> str:
    code = res.get("errno")
    if code == errno.EADDRINUSE:
        return (f"port {port} is already in use on {node} (a torchrun or TCPStore still running?); fix: stop it "
                f"(`ss -ltnp 'sport = :{port}'` on {node} shows who) or choose another --master-port")
    if code == errno.EACCES:
        return f"port {port} needs root on {node}; fix: choose a --master-port above 1023"
    return f"cannot listen on port {port} on {node} ({res.get('error')}); fix: choose another --master-port"


def unreachable(src: str, dst: str, address: str, port: int, res: dict, what: str = "") -> str:
    mesh = bool(what)
    why = {
        "timeout": ("timed out: a firewall on {dst} (or one on {src} dropping the replies) blocks it" if mesh else
                    "timed out: a firewall on {dst} drops it, or {dst} is WSL2 behind NAT"),
        "refused": "refused: a firewall on {dst} rejects it (our listener was up)",
        "foreign": "something other than our listener answered: a NAT or port forward in between",
    }.get(res.get("kind"), "{err}").format(dst=dst, src=src, err=res.get("error"))
    return (f"{src} cannot reach {dst} ({address}):{port}{what} — {why}; fix: on {dst} allow TCP {port} from the "
            f"other nodes (ufw: `sudo ufw allow from <LAN subnet> to any port {port} proto tcp`; firewalld: "
            f"`sudo firewall-cmd --add-port={port}/tcp`); on WSL2 set networkingMode=mirrored in %UserProfile%\\.wslconfig "
            "and allow the port in Windows Defender Firewall")


def _request_all(agents: dict[str, Agent], reqs: dict[str, dict], timeout: float) -> dict[str, dict | str]:
    """Send one request to each agent in parallel; name -> reply dict, or an error line."""
    def one(name: str) -> dict | str:
        try:
            return agents[name].request(reqs[name], timeout)
        except AgentError as exc:
            return str(exc)
    names = list(reqs)
    if not names:
        return {}
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return dict(zip(names, pool.map(one, names)))


@dataclass
class MeshResult:
    """pairs[(src, dst)] = None when src reached dst's random high port, else a one-line failure;
    addresses: name -> the IP the others dialled (which way gloo dials a pair depends on them)."""

    ports: dict[str, int | None] = field(default_factory=dict)
    pairs: dict[tuple[str, str], str | None] = field(default_factory=dict)
    ms: dict[tuple[str, str], float | None] = field(default_factory=dict)
    master_port: PortCheck | None = None
    addresses: dict[str, str] = field(default_factory=dict)


def check_ports(agents: dict[str, Agent], addresses: dict[str, str], *, master: str, master_port: int | None,
                mesh: bool = True, timeout: float = 3.0) -> MeshResult:
    """The master port (if given) and, with mesh, a random high port on every node, each tried
    from every other node. agents: name -> Agent (master included); addresses: name -> IP as
    the others reach it."""
    out = MeshResult(addresses=dict(addresses))
    listen_req = {}
    for name in agents:
        ports = []
        if name == master and master_port is not None:
            ports.append(master_port)
        if mesh:
            ports.append(0)
        if ports:
            listen_req[name] = {"op": "listen", "ports": ports}
    replies = _request_all(agents, listen_req, timeout + 5)
    pc = PortCheck(master=master, address=addresses.get(master, "?"), port=master_port or 0) if master_port else None
    for name, rep in replies.items():
        if isinstance(rep, str):
            out.ports[name] = None
            if pc and name == master:
                pc.master_error = rep
            continue
        for res in rep.get("listening", []):
            if res["asked"] == 0:
                out.ports[name] = res["port"]
            elif pc and name == master and res["port"] is None:
                pc.master_error = listen_error(master, master_port, res)
    token = secrets.token_hex(4)
    targets: dict[str, list[tuple[str, int, str]]] = {n: [] for n in agents}  # src -> [(dst, port, kind)]
    for src in agents:
        if pc and src != master and pc.master_error is None:
            targets[src].append((master, master_port, "master"))
        for dst, port in out.ports.items():
            if dst != src and port:
                targets[src].append((dst, port, "mesh"))
    conn_req = {src: {"op": "connect", "timeout": timeout,
                      "targets": [{"host": addresses[d], "port": p, "token": f"{token}-{src}"} for d, p, _ in t]}
                for src, t in targets.items() if t}
    replies = _request_all(agents, conn_req, timeout + 5)
    for src, t in targets.items():
        if not t:
            continue
        rep = replies.get(src)
        results = rep.get("results", []) if isinstance(rep, dict) else []
        for i, (dst, port, kind) in enumerate(t):
            res = results[i] if i < len(results) else {"ok": False, "kind": "error",
                                                         "error": rep if isinstance(rep, str) else "no answer"}
            failure = None if res.get("ok") else unreachable(
                src, dst, addresses[dst], port, res, "" if kind == "master" else " (random high port, as gloo/NCCL use)")
            if kind == "master":
                pc.workers[src] = failure
                pc.ms[src] = res.get("ms")
            else:
                out.pairs[(src, dst)] = failure
                out.ms[(src, dst)] = res.get("ms")
    if pc:
        for src in agents:
            if src != master and src not in pc.workers:
                pc.workers[src] = None if pc.master_error is None else f"not tried: {pc.master_error}"
    if mesh:
        for dst, port in out.ports.items():
            if port is None:
                for src in agents:
                    if src != dst:
                        out.pairs.setdefault((src, dst), f"{dst} could not open a listener for the mesh probe")
    out.master_port = pc
    return out


def check_master_port(master_session: Any, worker_sessions: list[Any], *, address: str, port: int,
                      timeout: float = 3.0) -> PortCheck:
    """Master port free on the master and reachable from every worker: a temporary listener on the
    master (bound like torch's TCPStore), a connect from each worker at `address`:`port`.
    Sessions are Session-like (`.node.name`, `.node.python`, `.pipe(argv)`)."""
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"master port {port} is outside 1-65535")
    sessions = [master_session, *worker_sessions]
    master = master_session.node.name

    def start(s: Any) -> Agent | str:
        try:
            return start_agent(s, timeout=timeout + 15)
        except AgentError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=len(sessions)) as pool:
        started = list(pool.map(start, sessions))
    agents = {s.node.name: a for s, a in zip(sessions, started) if isinstance(a, Agent)}
    try:
        if master not in agents:
            return PortCheck(master=master, address=address, port=port, master_error=started[0],
                             workers={s.node.name: f"not tried: {started[0]}" for s in worker_sessions})
        addresses = {name: address for name in agents}
        res = check_ports(agents, addresses, master=master, master_port=port, mesh=False, timeout=timeout)
        pc = res.master_port
        for s, a in zip(sessions[1:], started[1:]):
            if not isinstance(a, Agent):
                pc.workers[s.node.name] = a
        return pc
    finally:
        for a in agents.values():
            a.close()
