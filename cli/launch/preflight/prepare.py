"""The preflight stage: the nodes asked, then the plan (`prepare(options) -> LaunchPlan`), so that nothing starts
anywhere when something is wrong. It reads the LaunchOptions (cli/launch/plan/options.py) and nothing after it:
  1. the master address (an IP the workers reach; never loopback with other nodes);
  2. at once, over one connection per node: the trainer's own check of the overrides (its parser,
     `python -m auralm.training.command_line --check ...`, here), every node probed (netcheck's probe; torch
     facts cached, node_facts.py), each node's directories (data and run directory writable, with room, the data
     prepared for the task: storage.py), the master port (free on the master, reachable from every worker:
     netcheck), and the model's memory estimate (auralm.planning.sizing, plan/memory.py); on a Slurm allocation's
     nodes, torchrun itself starts meanwhile and waits for its arguments (prestart.py);
  3. the plan (plan/plan.py: each node's torchrun line and environment), each rank's planned memory against its
     node's (plan/memory.py) -> a LaunchPlan, printed by --dry-run (supervise/report.py) or run on every node
     (supervise/job.py, an attempt at a time: run/attempt.py).
"""

from __future__ import annotations

import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from netcheck import MasterAddressError, check_master_port, master_address

from cli.errors import HrmctlError, InventoryError
from cli.nodes.inventory import Node
from cli.launch.plan import memory
from cli.launch.plan.min_nodes import EXIT_BARRIER_S, in_place
from cli.launch.plan.options import TRAINER, LaunchOptions
from cli.launch.plan.overrides import check_trainer_args
from cli.launch.plan.plan import LaunchPlan, NodeFacts, build_plan, choose_backend, nproc_for
from cli.launch.preflight.node_facts import gather, remember
from cli.launch.preflight.prestart import hold_torchrun
from cli.launch.preflight.storage import DEFAULT_DATA_ENV, check_local, check_nodes, trainer_dirs
from cli.nodes.remote import Session, connect_all
from node.lines import last
from node.ship import program

DEFAULT_PORTS = range(29500, 29510)  # torchrun's default first, then its neighbours

def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def _master_port(session: Session, nodes: list[Node], master_addr: str, wanted: int | None) -> int:
    """--master-port, else torchrun's default or a neighbour (a port other nodes must be let through to), else, on one
    node alone, a free port picked at random below its ephemeral range (node/free_port.py): two runs on one machine
    at once do not race for 29500."""
    candidates = [wanted] if wanted is not None else [] if len(nodes) == 1 else list(DEFAULT_PORTS)
    avoid = f"{DEFAULT_PORTS.start}-{DEFAULT_PORTS.stop - 1}"  # torchrun's ports are left to runs across nodes
    res = session.run_python(program("free_port"), ["--avoid", avoid, *map(str, candidates)], timeout=30)
    port = (last(res.stdout) or {}).get("port") if res.ok else None
    if wanted is not None and port != wanted:
        raise HrmctlError(f"master port {wanted} is already in use on {nodes[0].name}; stop what holds it "
                          f"(`ss -ltnp 'sport = :{wanted}'` on {nodes[0].name}) or choose another --master-port")
    if port is None:
        raise HrmctlError(f"{nodes[0].name}: cannot find a free port ({res.last_line()})")
    return port


def _port(sessions: dict[str, Session], nodes: list[Node], addr: str, wanted: int | None) -> int:
    port = _master_port(sessions[nodes[0].name], nodes, addr, wanted)
    if len(nodes) > 1:
        _check_port_reachable(sessions, nodes, addr, port)
    return port


def _check_port_reachable(sessions: dict[str, Session], nodes: list[Node], addr: str, port: int) -> None:
    pc = check_master_port(sessions[nodes[0].name], [sessions[n.name] for n in nodes[1:]], address=addr, port=port)
    if not pc.ok:
        raise HrmctlError(f"refusing to launch, it would hang: {pc.failures()[0]}", exit_code=3)


def prepare(opts: LaunchOptions, reported: dict[str, dict] | None = None, hold: bool = False) -> LaunchPlan:
    """The plan for ``opts`` (checked by the command: LaunchOptions.check). ``reported``: what nodes said of their
    torch in a first launch (node/torchrun.py), cached first so that the plan is made from it. ``hold``: on
    a Slurm allocation's nodes, torchrun starts while the preflight runs (cli/launch/preflight/prestart.py)."""
    nodes = opts.nodes
    if reported:
        remember(reported, nodes)
    master = nodes[0]
    try:
        addr = master_address(master.host, master_is_local=master.is_local, peer_hosts=[w.host for w in nodes[1:]],
                              master_name=master.name)
    except MasterAddressError as exc:
        raise HrmctlError(str(exc)) from None
    run_id = opts.run_id or new_run_id()
    trainer = opts.module == TRAINER
    dirs, extra = trainer_dirs(opts.trainer, run_id) if trainer else (None, [])
    if not opts.dry_run:
        check_local(str(opts.runs_dir / run_id))  # hrmctl's own logs, here
    # One connection per node serves the whole preflight. Four things run at once: the trainer's
    # check of the overrides (a local `import torch`), the node probes, each node's directories
    # (and psutil), and the master port (chosen on the master, then tried from every worker).
    # Nothing starts before all four pass; the trainer's verdict is reported first, then the
    # nodes', their directories', then the port's.
    sessions = connect_all(nodes, opts.accept_new_host_keys)
    keep = False
    try:
        if hold and opts.use_cache and not opts.dry_run:
            hold_torchrun(sessions, nodes, run_id)
        with ThreadPoolExecutor(max_workers=5) as pool:
            check = pool.submit(check_trainer_args, opts.module, opts.args)
            size_f = pool.submit(memory.model_size, opts, 1)
            probes = pool.submit(gather, sessions, nodes, addr, use_cache=opts.use_cache, guess=not opts.dry_run)
            storage = pool.submit(check_nodes, sessions, nodes, dirs)
            port_f = pool.submit(_port, sessions, nodes, addr, opts.master_port)
            check.result()
            facts, probed = probes.result()
            answers = storage.result()
            port = port_f.result()
            size = size_f.result()
        _check_nproc(nodes, facts, opts.nproc, opts.gpus)
        if trainer:
            _check_packages(opts.trainer, master, probed.get(master.name))
        backend, why = choose_backend(opts.backend, facts)
        entry, node_env = {}, {}
        for node in nodes:
            args = list(opts.args)
            if dirs is not None and dirs.data_given is None and not dirs.train_path:  # the inventory's, per node
                args.append(f"data_dir={dirs.data[node.name]}")
                node_env[node.name] = {DEFAULT_DATA_ENV: dirs.data[node.name]}
            entry[node.name] = ["-m", opts.module, *args, *extra]
        leaves = trainer and in_place(opts.trainer, len(nodes))  # a node may leave, the others not restarted: DiLoCo
        plans = build_plan(nodes, facts, master_addr=addr, master_port=port, backend=backend, entry=entry,
                           run_id=run_id, user_env=opts.env, nproc=opts.nproc, node_env=node_env,
                           exit_barrier=EXIT_BARRIER_S if leaves else None)
        size = memory.check(opts, size, _data_vocab(answers, nodes[0].name), sum(nl.nproc for nl in plans),
                            memory.shares([(nl.node.name, nl.nproc) for nl in plans], facts),
                            lambda line: print(line, file=sys.stderr))
        keep = not opts.dry_run  # the launch starts the jobs over these connections: no second handshake
        return LaunchPlan(plans, backend, why, run_id, opts, sessions if keep else None, facts, size)
    finally:
        if not keep:
            for session in sessions.values():
                session.close()


def _data_vocab(answers: dict[str, dict], master: str) -> int | None:
    """The vocabulary of the master's data (its meta.json's tokenizer), when the storage check read one."""
    return next((d.get("vocab") for d in answers.get(master, {}).get("dirs", []) if d.get("kind") == "data"), None)


def _check_nproc(nodes: list[Node], facts: dict[str, NodeFacts], nproc: int | None, gpus: int | None = None) -> None:
    """--nproc within each node's GPUs (else its CPU cores); a guide's --gpus N (one process per GPU) within its GPUs."""
    for n in nodes:
        have = facts[n.name].gpus
        if gpus is not None and have < gpus:
            fix = f"--gpus {have}" if have else f"--nproc {gpus} for {gpus} processes on its CPU"
            raise InventoryError(f"{n.name}: --gpus {gpus} is a process on each of {gpus} GPUs, and {n.name} has "
                                 f"{f'{have} GPU(s)' if have else 'no GPU'} that torch can use; fix: {fix}, or drop "
                                 f"--gpus (hrmctl runs a process per GPU, else one)")
        count = nproc_for(n, facts[n.name], nproc)
        devices = facts[n.name].gpus or facts[n.name].cpus
        if count > devices:
            kind = "GPU(s)" if facts[n.name].gpus else "CPU core(s)"
            raise InventoryError(f"{n.name}: {count} processes but the node has {devices} {kind}; "
                                 f"use --nproc {devices} or less")


def _check_packages(cfg, master: Node, probe) -> None:
    """What the run's logging.* needs on rank 0's node (W&B's wandb, TensorBoard's tensorboard), against what its
    probe found installed: one line before launch, not rank 0's error after it. A probe that did not look (an older
    project there), or overrides the trainer refuses (``cfg`` None: its check says why), are left to the trainer."""
    from auralm.training import tracking

    if cfg is None:
        return
    needed = tracking.packages(cfg.logging)
    versions = ((probe.raw.get("project") or {}).get("versions") or {}) if probe is not None else {}
    missing = [(key, pkg) for key, pkg in needed if pkg in versions and versions[pkg] is None]
    if missing:
        keys, pkgs = [k for k, _ in missing], [p for _, p in missing]
        raise HrmctlError(f"{master.name}: {tracking.missing_line(keys, pkgs)}, not installed for {master.python} "
                          f"there (rank 0 logs from {master.name}); fix: on {master.name} `{master.python} -m pip "
                          f"install {' '.join(pkgs)}`, or drop {' and '.join(keys)}")
