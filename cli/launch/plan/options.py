"""The plan stage's first part: what the user asked for, read and checked once, as one LaunchOptions.

`hrmctl train` / `hrmctl test-ddp` (cli/app.py) give their options to `launch_options()`, which selects the nodes
(--nodes from the inventory, or this machine alone), reads --env and refuses a bad --backend; `check()` refuses a
bad --nproc, --master-port or --max-restarts (after a guide's spellings of them were read, cli/launch/command.py).
The stages after it (preflight -> run -> supervise) read this one object; none of them takes the options again
one by one. May import: cli.nodes, cli.slurm.allocation, cli.errors.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cli.errors import HrmctlError, InventoryError
from cli.nodes.inventory import Node, load_inventory, local_node

TRAINER = "auralm.training.train"  # the module torchrun starts for `hrmctl train` (test-ddp: auralm.planning.ddp_check)
BACKENDS = ("auto", "gloo", "nccl")


def resume_latest(args: list[str]) -> list[str]:
    """The trainer's overrides resuming from the run's last checkpoint (a restart, a regroup): ``resume=latest`` in
    place of any resume they had."""
    return [a for a in args if not a.startswith("resume=") and a != "--resume"] + ["resume=latest"]


@dataclass
class LaunchOptions:
    nodes: list[Node]
    module: str = TRAINER
    args: list[str] = field(default_factory=list)
    master_port: int | None = None
    nproc: int | None = None
    backend: str = "auto"
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    dry_run: bool = False
    run_id: str | None = None
    runs_dir: Path = Path("runs")
    accept_new_host_keys: bool = False
    use_cache: bool = True
    quiet: bool = False  # the run's lines in its files only (test-ddp --json)
    json_output: bool = False  # stdout is for one JSON document: the live log goes to stderr
    result_tag: str | None = None  # a line with this prefix is a result for on_result(node, payload)
    on_result: Callable[[str, str], None] | None = None
    detached: bool = False  # this process is a detached run's supervisor (supervise/detach.py), in a session of its own
    inventory: str | None = None  # --inventory as given (None: $HRMCTL_INVENTORY, else ./hrmctl.toml)
    nodes_given: bool = False  # --nodes was given (else this machine alone, or the Slurm allocation's nodes)
    gpus: int | None = None  # a guide's --gpus N: --nproc N, each process on a GPU of its own (the preflight checks)
    distributed: bool = False  # a guide's --distributed: a run across machines (cli/launch/plan/guide_options.py)
    _read: tuple | None = field(default=None, init=False, repr=False, compare=False)  # (args, config, refusal)

    @property
    def trainer(self):
        """The trainer's reading of ``args`` by its own parser (auralm.training.command_line, no torch): its Config, made
        once for these args and read by every stage; None for another module, or when the trainer refuses them
        (``trainer_refusal`` says why)."""
        return self._trainer_read()[0]

    @property
    def trainer_refusal(self) -> str:
        """Why the trainer refuses ``args`` ("" when it takes them, or for another module)."""
        return self._trainer_read()[1]

    def _trainer_read(self) -> tuple:
        if self._read is None or self._read[0] != tuple(self.args):  # the command reads a guide's spellings into args
            read: tuple = (None, "")
            if self.module == TRAINER:
                from auralm.errors import UserError
                from auralm.training import command_line

                try:
                    read = (command_line.parse_command_line(self.args)[0], "")
                except (UserError, ValueError) as e:
                    read = (None, str(e))
            self._read = (tuple(self.args), *read)
        return self._read[1:]

    def check(self) -> None:
        """The numbers a launch cannot start with: one line each, exit code 2."""
        if self.backend not in BACKENDS:
            raise HrmctlError(f"--backend {self.backend}: choose auto, gloo or nccl")
        if self.nproc is not None and self.nproc < 1:
            raise InventoryError(f"--nproc {self.nproc}: every node needs at least 1 process; give --nproc 1 or more")
        if self.master_port is not None and not 1 <= self.master_port <= 65535:
            raise HrmctlError(f"--master-port {self.master_port} is outside 1-65535; choose a free port such as 29500")
        if self.max_restarts < 0:
            raise HrmctlError(f"--max-restarts {self.max_restarts}: give 0 or more")


def select_nodes(inventory: str | None, nodes: str | None) -> list[Node]:
    """--nodes from the inventory; without --nodes, the nodes of the Slurm allocation this runs in (SLURM_JOB_ID set:
    reached with srun, cli/slurm/allocation.py), else this machine alone (the embedded default)."""
    if nodes is None:
        from cli.slurm.allocation import allocation_id, allocation_nodes

        job = allocation_id()
        return allocation_nodes(job) if job else [local_node()]
    return load_inventory(inventory).select(nodes)


def launch_options(*, inventory: str | None, nodes: str | None, env: list[str] | None, reprobe: bool,
                   **given) -> LaunchOptions:
    """The command line's options as one LaunchOptions: the nodes selected, --env read, --reprobe as use_cache;
    ``given`` are LaunchOptions' own fields (module, args, master_port, nproc, backend, ...)."""
    return LaunchOptions(nodes=select_nodes(inventory, nodes), env=parse_env_options(env or []),
                         use_cache=not reprobe, inventory=inventory, nodes_given=nodes is not None, **given)


def parse_env_options(items: list[str]) -> dict[str, str]:
    """`--env KEY=VALUE` (repeatable) as a dict; a bad item is one clear error."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise HrmctlError(f"--env {shlex.quote(item)}: expected KEY=VALUE with a shell variable name as KEY")
        out[key] = value
    return out
