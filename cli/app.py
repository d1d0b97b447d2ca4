"""The hrmctl command line. Each command is a thin layer over a module that holds its logic."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated, Optional

from .fast_start import defer_module

defer_module("invoke")  # paramiko needs it only for `Match exec` in ~/.ssh/config (see cli/fast_start.py)

import typer  # noqa: E402
from rich.console import Console  # noqa: E402

from . import __version__  # noqa: E402
from .errors import HrmctlError  # noqa: E402

if TYPE_CHECKING:
    from .inventory import Inventory

app = typer.Typer(
    name="hrmctl",
    help="Turn a few machines on one LAN into one training cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
out = Console()
err = Console(stderr=True)

# Options shared by the commands that talk to nodes.
InventoryOpt = Annotated[Optional[str], typer.Option(
    "--inventory", "-i", envvar="HRMCTL_INVENTORY", help="Inventory file (default: ./hrmctl.toml).")]
NodesOpt = Annotated[Optional[str], typer.Option(
    "--nodes", "-n", help="Comma-separated node names; the first is the master unless the inventory says otherwise.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new-host-keys", help="Record the host key of a node never seen before (a changed key is always refused).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]


def _version(value: bool) -> None:
    if value:
        out.print(f"hrmctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                 help="Show the version and exit.")] = False) -> None:
    """hrmctl: doctor, sync-data, test-ddp and train across the nodes of hrmctl.toml."""


def inventory_and_nodes(inventory: str | None, nodes: str | None):
    from .inventory import load_inventory  # imports paramiko: not needed for --help or --version

    inv: Inventory = load_inventory(inventory)
    return inv, inv.select(nodes)


@app.command("nodes")
def nodes_cmd(
    nodes: NodesOpt = None,
    inventory: InventoryOpt = None,
    check: Annotated[bool, typer.Option("--check", help="Connect to every node in parallel and run a command there.")] = False,
    accept_new_host_keys: AcceptNewOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Show every node's resolved settings and where each value came from."""
    from .nodes_view import show_nodes

    inv, selected = inventory_and_nodes(inventory, nodes)
    code = show_nodes(inv, selected, check=check, accept_new_host_keys=accept_new_host_keys,
                      as_json=as_json, console=out)
    raise typer.Exit(code)


@app.command("doctor")
def doctor_cmd(
    nodes: NodesOpt = None,
    inventory: InventoryOpt = None,
    master_port: Annotated[int, typer.Option("--master-port", help="The rendezvous port to check on the master.")] = 29500,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds each node may take to answer the probe.")] = 60.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Full details in every cell, and interfaces.")] = False,
    accept_new_host_keys: AcceptNewOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Preflight every node: reachability, ports, clocks, CUDA/NCCL, libuv, versions, interfaces."""
    from .doctor_cmd import doctor

    raise typer.Exit(doctor(inventory, nodes, master_port=master_port, timeout=timeout, verbose=verbose,
                            accept_new_host_keys=accept_new_host_keys, as_json=as_json, console=out))


@app.command("sync-data")
def sync_data_cmd(
    node: Annotated[Optional[str], typer.Argument(help="The node to sync (or several with --nodes).")] = None,
    nodes: NodesOpt = None,
    src: Annotated[str, typer.Option("--src", help="Local data directory to send.")] = "data",
    dest: Annotated[Optional[str], typer.Option(
        "--dest", help="Directory on the node (default: the node's data_dir from the inventory).")] = None,
    checksum: Annotated[bool, typer.Option("--checksum", "-c", help="Compare SHA-256 of every file, not size+mtime.")] = False,
    delete: Annotated[bool, typer.Option("--delete", help="Remove files on the node that are not in the source.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would change; change nothing.")] = False,
    stall_timeout: Annotated[float, typer.Option(
        "--stall-timeout", min=1, help="Give up on a node that answers nothing for this many seconds.")] = 30.0,
    inventory: InventoryOpt = None,
    accept_new_host_keys: AcceptNewOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Make a node's dataset match the local one over SSH: only changes, verified, resumable."""
    from .sync import sync_nodes
    from .sync_view import show_report

    if node and nodes:
        raise HrmctlError(f"name the nodes once: either `sync-data {node}` or `--nodes {nodes}`, not both")
    if not node and not nodes:
        raise HrmctlError("name the node to sync: `hrmctl sync-data NODE` or `--nodes node1,node2`")
    _, selected = inventory_and_nodes(inventory, node or nodes)
    report = sync_nodes(selected, src, dest=dest, checksum=checksum, delete=delete, dry_run=dry_run,
                        console=err, progress=not as_json, accept_new_host_keys=accept_new_host_keys,
                        stall_timeout=stall_timeout)
    code = show_report(report, as_json=as_json, console=out, err=err)
    global _quick_exit
    _quick_exit = True  # every connection is closed, nothing left to clean up: see run()
    raise typer.Exit(code)


# Options shared by the two commands that launch torchrun (train, test-ddp); logic in cli/launch*.py.
LaunchNodesOpt = Annotated[Optional[str], typer.Option(
    "--nodes", "-n", help="Comma-separated node names, the master first. Default: this machine alone.")]
MasterPortOpt = Annotated[Optional[int], typer.Option(
    "--master-port", help="Rendezvous port on the master (default: 29500, or the next free one).")]
NprocOpt = Annotated[Optional[int], typer.Option(
    "--nproc", help="Processes per node (default: the inventory's nproc; auto = one per GPU, else 1).")]
BackendOpt = Annotated[str, typer.Option("--backend", help="auto (NCCL only if every node has CUDA+NCCL), gloo or nccl.")]
EnvOpt = Annotated[Optional[list[str]], typer.Option("--env", "-e", help="KEY=VALUE set on every node (repeatable).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print each node's exact command and environment; run nothing.")]
RunIdOpt = Annotated[Optional[str], typer.Option("--run-id", help="Name of the run (default: date-time-random).")]
ReprobeOpt = Annotated[bool, typer.Option("--reprobe", help="Probe torch on every node again (ignore the cached facts).")]


@app.command("test-ddp")
def test_ddp_cmd(
    nodes: LaunchNodesOpt = None,
    inventory: InventoryOpt = None,
    master_port: MasterPortOpt = None,
    nproc: NprocOpt = None,
    backend: BackendOpt = "auto",
    env: EnvOpt = None,
    min_size: Annotated[str, typer.Option("--min-size", help="Smallest all_reduce message.")] = "1KiB",
    max_size: Annotated[str, typer.Option("--max-size", help="Largest all_reduce message.")] = "64MiB",
    seconds: Annotated[float, typer.Option("--seconds", help="Measuring time per message size.")] = 0.25,
    soak: Annotated[float, typer.Option("--soak", help="Then keep checking all_reduce for this many seconds.")] = 0.0,
    no_bandwidth: Annotated[bool, typer.Option("--no-bandwidth", help="Correctness only.")] = False,
    dry_run: DryRunOpt = False,
    run_id: RunIdOpt = None,
    reprobe: ReprobeOpt = False,
    accept_new_host_keys: AcceptNewOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """A real collective across the nodes: correctness and bandwidth."""
    from .launch_cmd import DDP_CHECK, ddp_check_args, options, test_ddp

    args = ddp_check_args(min_size=min_size, max_size=max_size, seconds=seconds, soak=soak, no_bandwidth=no_bandwidth)
    opts = options(inventory=inventory, nodes=nodes, master_port=master_port, nproc=nproc, backend=backend, env=env,
                   max_restarts=0, dry_run=dry_run, run_id=run_id, accept_new_host_keys=accept_new_host_keys,
                   reprobe=reprobe, module=DDP_CHECK, args=args)
    raise typer.Exit(test_ddp(opts, as_json=as_json, console=out, err=err))


@app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train_cmd(
    ctx: typer.Context,
    nodes: LaunchNodesOpt = None,
    inventory: InventoryOpt = None,
    master_port: MasterPortOpt = None,
    nproc: NprocOpt = None,
    backend: BackendOpt = "auto",
    env: EnvOpt = None,
    max_restarts: Annotated[int, typer.Option("--max-restarts", help="Restart the whole job from its last checkpoint after a failure, up to N times.")] = 0,
    sync_data: Annotated[bool, typer.Option("--sync-data", help="Sync the local dataset to every other node first.")] = False,
    module: Annotated[str, typer.Option("--module", help="The Python module torchrun starts on every rank.")] = "auralm.train",
    dry_run: DryRunOpt = False,
    run_id: RunIdOpt = None,
    reprobe: ReprobeOpt = False,
    accept_new_host_keys: AcceptNewOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """torchrun on every node, one merged log, one Ctrl-C. With no nodes: this machine alone.

    Trainer overrides follow as key=value (e.g. `hrmctl train --nodes node0,node1 max_steps=200`).
    """
    from .launch_cmd import options, train

    opts = options(inventory=inventory, nodes=nodes, master_port=master_port, nproc=nproc, backend=backend, env=env,
                   max_restarts=max_restarts, dry_run=dry_run, run_id=run_id,
                   accept_new_host_keys=accept_new_host_keys, reprobe=reprobe, module=module, args=ctx.args)
    raise typer.Exit(train(opts, sync_data=sync_data, as_json=as_json, console=out, err=err))


@app.command("prepare-data", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def prepare_data_cmd(ctx: typer.Context) -> None:
    """Turn a corpus (or generated sudoku puzzles) into training shards and a manifest.

    SOURCE --out DIR [--vocab-size N] for lm; --task sudoku --out DIR [--count N]. `--help` lists all.
    """
    import subprocess

    # The trainer's own data tool, run as a process like every other use of auralm by the cli.
    code = subprocess.call([sys.executable, "-m", "auralm.data", *ctx.args],
                           env=dict(os.environ, AURALM_PROG="hrmctl prepare-data"))
    raise typer.Exit(code)


def _usage_error_types() -> tuple[type, ...]:
    """The click exceptions typer raises for bad usage: its vendored copy (typer >= 0.2x) and click's."""
    found: list[type] = []
    try:
        from typer._click.exceptions import ClickException
        found.append(ClickException)
    except ImportError:
        pass
    try:
        from click import ClickException as PlainClickException
        found.append(PlainClickException)
    except ImportError:
        pass
    return tuple(found)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure is one line on stderr and a meaningful exit code."""
    try:
        code = app(args=argv, standalone_mode=False)
        return code if isinstance(code, int) else 0
    except HrmctlError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err.print("aborted")
        return 130
    except Exception as exc:  # usage errors, raised by typer's own (vendored) click
        if not isinstance(exc, _usage_error_types()):
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # the help text
            return exc.exit_code
        where = getattr(getattr(exc, "ctx", None), "command_path", None) or "hrmctl"
        err.print(f"error: {exc.format_message()} (see `{where} --help`)", markup=False, highlight=False,
                  soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


_quick_exit = False  # set by a command whose process may end without tearing down its modules


def run() -> None:
    code = main()
    if _quick_exit:
        from .fast_start import quick_exit
        quick_exit(code)  # about 90 ms less than the interpreter's own teardown
    sys.exit(code)


if __name__ == "__main__":
    run()
