"""The fast preflight's view of each node: netcheck's probe, with torch's answers cached.

`import torch` costs seconds on a small machine, and a launch pays it again on every node when
torchrun starts. So the probe runs without torch (route to the master, interfaces, hostname,
python, project, the driver's GPU count: a fraction of a second), and torch's answers (GPUs,
NCCL, libuv) are taken from torch-facts.json in hrmctl's cache (cli/cache.py) when the same node, Python and torch
version were seen in the last day. A node not seen yet is launched on a guess (`guessed` facts:
the driver's GPUs, NCCL with them, libuv on) through node/torchrun.py, which checks the guess
with torchrun's own import of torch and reports the real answers (`remember` caches them); a
wrong guess makes the launcher plan again (launch.run). `guess=False` (the dry run, `--no-cache`)
probes torch instead, so what is printed is exact. The trainer rechecks the backend collectively
at start, so a stale GPU count costs a fallback to gloo, never a hang.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

from netcheck import NodeProbe, ProbeError, run_probe
from netcheck.node_probe_client import probe_window

from cli.cache import cache_dir, load as load_cache, save as save_cache
from cli.errors import HrmctlError, RemoteError
from cli.nodes.inventory import Node
from cli.launch.plan.plan import NodeFacts
from cli.nodes.remote import Session

CACHE_DIR = cache_dir()
CACHE = CACHE_DIR / "torch-facts.json"
CACHE_TTL_S = 24 * 3600
PROBE_TIMEOUT_S = 60  # SSH, the interpreter and torch's import on a cold laptop; answered within probe_window()


def _key(node: Node, torch_version: str | None) -> str:
    """The cache key of a node's torch facts (torch as its distribution names itself)."""
    return f"{node.name}|{node.host}|{node.port}|{node.user}|{node.python}|{torch_version or ''}"


def known(node: Node, cache: dict) -> bool:
    """Whether the cache holds this node's torch facts (for some torch version)."""
    return any(k.startswith(_key(node, "")) for k in cache)


def _torch_version(probe: NodeProbe) -> str | None:
    return ((probe.raw.get("project") or {}).get("versions") or {}).get("torch")




def _probe(session: Session, master_addr: str, *, with_torch: bool) -> NodeProbe:
    """The node's probe, answered within its window: a torch still importing then is one line saying so and what to
    do, not a timeout that loses the whole answer (nor a guess launched on a node that cannot import torch yet)."""
    probe = run_probe(session, route_to=master_addr, timeout=PROBE_TIMEOUT_S, with_torch=with_torch,
                      within=probe_window(PROBE_TIMEOUT_S))
    if probe.torch_importing_s is not None:
        node = session.node
        raise HrmctlError(f"{node.name}: torch was still importing after {probe.torch_importing_s:.0f} s, the "
                          f"preflight probe's window (a cold or busy node's first import); fix: `hrmctl doctor "
                          f"--nodes {node.name} --timeout 120` waits for it and warms it, then launch again")
    return probe


def _check(node: Node, probe: NodeProbe) -> None:
    """The node can run torchrun from its workdir: one clear line otherwise."""
    project = probe.raw.get("project") or {}
    if node.reached_by == "ssh" and not project.get("present"):  # locally (or srun: shared files), hrmctl's own
        raise HrmctlError(f"{node.name}: workdir {node.workdir} has no hrmctl project (no auralm/ in it); "
                          f"copy the project there or set workdir for {node.name} in the inventory")


def _slow_dns(probe: NodeProbe) -> bool:
    dns = probe.raw.get("dns") or {}
    return bool(dns.get("hang")) or (dns.get("reverse_lookup_ms") or 0) > 1000


def _memory_gb(probe: NodeProbe) -> float | None:
    """The RAM the node has available: the machine's figure, or its memory cgroup's when that is less."""
    res = probe.raw.get("resources") or {}
    found = [v for v in (res.get("mem_available_gb"), res.get("mem_cgroup_available_gb")) if v is not None]
    return min(found) if found else None


def _torch_facts(probe: NodeProbe) -> dict:
    return {"torch": probe.torch_version, "gpus": probe.cuda_devices, "nccl": probe.nccl_usable,
            "libuv_ok": probe.libuv_ok is not False, "error": probe.torch_error}


def _guess(probe: NodeProbe) -> dict:
    """torch's answers as far as they can be told without torch; node/torchrun.py checks them."""
    gpus = int(probe.raw.get("nvidia_gpus") or 0)
    return {"torch": _torch_version(probe), "gpus": gpus, "nccl": gpus > 0, "libuv_ok": True, "error": None,
            "guessed": True}


def _can_check(node: Node, probe: NodeProbe) -> bool:
    """node/torchrun.py runs there: the node's project has it, or this very hrmctl runs it locally."""
    return bool((probe.raw.get("project") or {}).get("launch_check")) or (node.reached_by != "ssh" and node.python == sys.executable)


def remember(reported: dict[str, dict], nodes: list[Node]) -> None:
    """Cache what node/torchrun.py reported, by node name: the next launch needs no guess."""
    now = time.time()
    fresh = {_key(n, reported[n.name].get("torch")): dict(reported[n.name], at=now)
             for n in nodes if n.name in reported and not reported[n.name].get("error")}
    if fresh:
        save_cache(CACHE, {**load_cache(CACHE), **fresh})


def gather(sessions: dict[str, Session], nodes: list[Node], master_addr: str, *,
           use_cache: bool = True, guess: bool = True) -> tuple[dict[str, NodeFacts], dict[str, NodeProbe]]:
    """NodeFacts per node (and the probes), or the first node's problem as one HrmctlError.
    `sessions` are open sessions by node name (one connection per node serves the whole preflight).
    Without `guess`, a node whose torch facts are not cached is probed with torch."""
    cache = load_cache(CACHE) if use_cache else {}
    guess = guess and use_cache
    now = time.time()
    fresh: dict[str, dict] = {}

    def one(session: Session) -> tuple[NodeProbe, dict]:
        try:
            return probe_one(session)
        except ProbeError as exc:
            raise HrmctlError(str(exc)) from None

    def probe_one(session: Session) -> tuple[NodeProbe, dict]:
        node = session.node
        probe = _probe(session, master_addr, with_torch=not (known(node, cache) or guess))
        _check(node, probe)
        if probe.raw.get("torch") is None:  # probed without torch
            hit = cache.get(_key(node, _torch_version(probe)))
            if hit and now - hit.get("at", 0) < CACHE_TTL_S and not hit.get("error"):
                return probe, hit
            if guess and _torch_version(probe) and _can_check(node, probe):
                return probe, _guess(probe)
            # not cached (or torch not installed: the probe with torch says why), and no guessing
            probe = _probe(session, master_addr, with_torch=True)
        tf = _torch_facts(probe)
        fresh[_key(node, _torch_version(probe))] = dict(tf, at=now)
        return probe, tf

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = [pool.submit(one, sessions[n.name]) for n in nodes]
    for node, fut in zip(nodes, futures):
        exc = fut.exception()
        if isinstance(exc, HrmctlError):
            raise exc
        if exc is not None:  # a surprise on one node is still one line naming it
            raise RemoteError(f"{node.name}: {type(exc).__name__}: {exc}")
    if fresh:
        save_cache(CACHE, {**cache, **fresh})
    facts, probes = {}, {}
    for node, fut in zip(nodes, futures):
        probe, tf = fut.result()
        if tf.get("error") or not tf.get("torch"):
            raise HrmctlError(f"{node.name}: torch does not import with {node.python} ({tf.get('error')}); "
                              f"install torch in that Python (pip install torch) or set python for {node.name}")
        if probe.route_error and len(nodes) > 1:
            raise HrmctlError(f"{node.name}: {probe.route_error}; the node cannot reach the master {master_addr}")
        facts[node.name] = NodeFacts(cpus=probe.cpu_usable or probe.cpu_count or 1, gpus=tf["gpus"], nccl=tf["nccl"],
                                     libuv_ok=tf["libuv_ok"], ifname=probe.route_ifname, torch=tf["torch"],
                                     slow_dns=_slow_dns(probe), guessed=bool(tf.get("guessed")),
                                     wrapped=_can_check(node, probe),
                                     mem_available_gb=_memory_gb(probe),
                                     gpu_memory_gb=min((g.get("memory_gb") or 0 for g in probe.gpus), default=None))
        probes[node.name] = probe
    return facts, probes

