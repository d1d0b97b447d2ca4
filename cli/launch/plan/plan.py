"""What runs on each node: the exact torchrun command line and environment.

The plan is a pure function of the nodes, what their probes found, the master address and port,
and the user's options. `--dry-run` prints it and a real launch runs it, so the two cannot differ.

Rendezvous: static (`--rdzv-backend=static` with `--master-addr/--master-port/--node-rank`), not
c10d. hrmctl already knows every node and gives each its rank, so elastic membership brings
nothing, and c10d costs on a LAN of laptops: its rank 0 advertises `socket.getfqdn()` unless
`--local-addr` is right on every node (the hostname -> 127.0.1.1 trap), it opens a second store on
a random port beyond the master port (one more hole in the firewall), and its keep-alives are
sensitive to clock skew. With static rendezvous there is one TCPStore, on the master port of the
address we pass, and the node ranks are the order of --nodes. Restarts are whole-job restarts
done by hrmctl (`--max-restarts`), so torchrun's own restarts stay at 0.

libuv: on torch 2.13 (checked in tests/unit/test_launch_plan.py) `TCPStore(...)` ignores
USE_LIBUV and the static rendezvous creates its store without `use_libuv`, so USE_LIBUV=0 alone
does not turn libuv off for the rendezvous store. For a node whose torch has no libuv we set
USE_LIBUV=0 (read by init_process_group's env:// store) and put `cli/launch/nolibuv` first on
PYTHONPATH: its sitecustomize makes every TCPStore created in torchrun and its workers default to
use_libuv=False (the `?use_libuv=0` of an init URL, applied where no URL exists).
"""

from __future__ import annotations

import json
import re
import dataclasses
from dataclasses import dataclass, field

from cli.launch.plan.options import LaunchOptions, resume_latest
from cli.nodes.inventory import Node
from cli.nodes.remote import Session, command_line

TORCHRUN = ["-m", "torch.distributed.run"]
CHECKED_TORCHRUN = ["-m", "node", "torchrun"]  # torchrun, once the node's torch confirms the guessed facts
SECRET_RE = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API_?KEY|PRIVATE|AUTH", re.I)
RANK_PREFIX = "[rank${rank}]:"  # torchrun --tee prefixes every worker line with it
SHUTDOWN_TIMEOUT_S = 3  # torchrun: SIGTERM to workers, then SIGKILL after this
NOLIBUV_DIR = "cli/launch/nolibuv"


@dataclass
class NodeFacts:
    """What the launcher needs to know about one node (from its probe)."""

    cpus: int = 1
    gpus: int = 0
    nccl: bool = False
    libuv_ok: bool = True
    ifname: str | None = None  # the interface of the node's route to the master
    torch: str | None = None
    slow_dns: bool = False  # reverse lookups wait on a nameserver that does not answer
    guessed: bool = False  # gpus/nccl/libuv_ok guessed without torch: node/torchrun.py checks them
    wrapped: bool = False  # torchrun started through node/torchrun.py (the node's project has it)
    mem_available_gb: float | None = None  # RAM available, or what the node's memory cgroup leaves if less
    gpu_memory_gb: float | None = None  # the smallest GPU's memory (probed with torch), None: unknown or no GPU


@dataclass
class NodeLaunch:
    node: Node
    node_rank: int
    nproc: int
    first_rank: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    notes: list[str] = field(default_factory=list)
    args_at: int = 0  # argv[args_at:] are the module's own arguments (the trainer's overrides), as the plan made them

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.nproc)

    def resumed(self) -> "NodeLaunch":
        """The same launch resuming from the run's last checkpoint (a restart): its module's arguments with
        ``resume=latest`` in place of any resume of theirs."""
        return dataclasses.replace(self, argv=self.argv[:self.args_at] + resume_latest(self.argv[self.args_at:]))

    def shell_line(self, redact: bool = False) -> str:
        """The exact line the node's shell runs (over SSH) - or its equivalent locally."""
        env = redacted(self.env) if redact else self.env
        return command_line(self.argv, self.cwd, env)


@dataclass
class LaunchPlan:
    """The launch as planned by cli/launch/preflight/prepare.py, and all that the run needs: made once (again only when
    a first launch's guessed facts were wrong on a node), then given to cli/launch/supervise/job.py whole."""

    plans: list[NodeLaunch]
    backend: str
    why: str
    run_id: str
    options: LaunchOptions  # what the user asked for (the run reads max_restarts, runs_dir, the output's settings)
    sessions: dict[str, Session] | None = None  # the preflight's connections, for the first attempt
    facts: dict[str, NodeFacts] | None = None  # what the probes found, by node name (the dry run's memory)
    size: dict | None = None  # the trainer's model and memory estimate for one rank (auralm.planning.sizing; None: not it)

    @property
    def world(self) -> int:
        return sum(p.nproc for p in self.plans)


def redacted(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if SECRET_RE.search(k) else v) for k, v in env.items()}


def nproc_for(node: Node, facts: NodeFacts, override: int | None) -> int:
    """Processes on this node: --nproc, else the inventory's number, else one per GPU (at least 1)."""
    want = override if override is not None else node.nproc
    if want == "auto":
        return max(1, facts.gpus)
    return int(want)


def choose_backend(requested: str, facts: dict[str, NodeFacts]) -> tuple[str, str]:
    """(backend, why): NCCL only when every node has CUDA and NCCL, else gloo for the whole world."""
    lacking = [name for name, f in facts.items() if not (f.gpus and f.nccl)]
    if requested == "gloo":
        return "gloo", "gloo requested"
    if requested == "nccl":
        return "nccl", "nccl requested" + (f" (no CUDA+NCCL on {', '.join(lacking)}: the trainer will fall "
                                           "back to gloo on all ranks)" if lacking else "")
    if not lacking:
        return "nccl", "every node has CUDA and NCCL"
    return "gloo", f"gloo for all: no CUDA+NCCL on {', '.join(lacking)}"


def build_plan(nodes: list[Node], facts: dict[str, NodeFacts], *, master_addr: str, master_port: int,
               backend: str, entry: list[str] | dict[str, list[str]], run_id: str,
               user_env: dict[str, str] | None = None, nproc: int | None = None,
               node_env: dict[str, dict[str, str]] | None = None, exit_barrier: float | None = None) -> list[NodeLaunch]:
    """One NodeLaunch per node, master (node rank 0) first. `entry` is the module and its args (the same on
    every node, or by node name); `node_env` adds variables per node (the user's --env still wins).
    `exit_barrier`: seconds torchrun's agent waits for the others at its end (node/torchrun.py), for a
    run that a node may leave without the others restarting."""
    counts = [nproc_for(n, facts[n.name], nproc) for n in nodes]
    world = sum(counts)
    plans = []
    first = 0
    for rank, (node, count) in enumerate(zip(nodes, counts)):
        f = facts[node.name]
        ifname = node.ifname or f.ifname
        env = {
            "HRMCTL_RUN_ID": run_id,
            "HRMCTL_JOB": f"{run_id}/{node.name}",  # every process of the job inherits it: how stop finds them
            "HRMCTL_BACKEND": backend,
            "HRMCTL_WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": str(node.threads or max(1, f.cpus // count)),
            "PYTHONUNBUFFERED": "1",
            "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX,
        }
        notes = []
        if ifname and len(nodes) > 1:
            env["GLOO_SOCKET_IFNAME"] = ifname
            env["NCCL_SOCKET_IFNAME"] = ifname
            notes.append(f"sockets on {ifname}" + (" (inventory)" if node.ifname else " (route to the master)"))
        if not f.libuv_ok:
            env["USE_LIBUV"] = "0"
            env["PYTHONPATH"] = NOLIBUV_DIR
            notes.append("libuv off (the libuv TCPStore does not start on this node)")
        if f.slow_dns:  # c10d looks up every peer's name; glibc reads RES_OPTIONS
            env["RES_OPTIONS"] = "timeout:1 attempts:1"
            notes.append("DNS does not answer: resolver timeout cut to 1 s")
        env.update((node_env or {}).get(node.name, {}))
        env.update(user_env or {})
        node_entry = entry[node.name] if isinstance(entry, dict) else entry
        if f.guessed:
            notes.append("first launch here: torch's answers guessed, confirmed on the node before torchrun starts")
        argv = [node.python, *_torchrun(f, exit_barrier),
                f"--nnodes={len(nodes)}", f"--node-rank={rank}", f"--nproc-per-node={count}",
                "--rdzv-backend=static", f"--rdzv-id={run_id}",
                f"--master-addr={master_addr}", f"--master-port={master_port}",
                "--max-restarts=0", "--tee=3", "--monitor-interval=0.5",
                f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}", *node_entry]
        plans.append(NodeLaunch(node=node, node_rank=rank, nproc=count, first_rank=first, argv=argv, env=env,
                                args_at=len(argv) - len(node_entry) + 2,  # after `-m MODULE`
                                cwd=node.workdir, notes=notes))
        first += count
    return plans


def _torchrun(f: NodeFacts, exit_barrier: float | None) -> list[str]:
    """torchrun through node/torchrun.py where the node's project has it (to confirm guessed facts, to shorten
    its exit barrier, and for its cheaper end in any case), else torchrun itself."""
    own = []
    if f.guessed:
        own += ["--expect", json.dumps({"gpus": f.gpus, "nccl": f.nccl, "libuv_ok": f.libuv_ok}, separators=(",", ":"))]
    if exit_barrier is not None:
        own += ["--exit-barrier", f"{exit_barrier:g}"]
    return [*CHECKED_TORCHRUN, *own, "--"] if own or f.wrapped else TORCHRUN

