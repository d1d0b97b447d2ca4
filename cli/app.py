"""The hrmctl command line. Each command is a thin layer over a module that holds its logic."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

import click
import typer
from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import HrmctlError
from .inventory import Inventory, load_inventory

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


def _not_built(name: str) -> None:
    raise HrmctlError(f"`hrmctl {name}` is not built yet in this version; see the README for what works today")


@app.command("doctor", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def doctor_cmd() -> None:
    """Preflight every node: reachability, ports, clocks, CUDA/NCCL, libuv, versions, interfaces."""
    _not_built("doctor")


@app.command("sync-data", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sync_data_cmd() -> None:
    """Make a node's dataset match the local one over SSH."""
    _not_built("sync-data")


@app.command("test-ddp", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def test_ddp_cmd() -> None:
    """A real collective across the nodes: correctness and bandwidth."""
    _not_built("test-ddp")


@app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train_cmd() -> None:
    """torchrun on every node, one merged log, one Ctrl-C. With no nodes: this machine alone."""
    _not_built("train")


@app.command("prepare-data", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def prepare_data_cmd() -> None:
    """Turn a corpus (or generated sudoku puzzles) into training shards and a manifest."""
    _not_built("prepare-data")


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure is one line on stderr and a meaningful exit code."""
    try:
        code = app(args=argv, standalone_mode=False)
        return code if isinstance(code, int) else 0
    except HrmctlError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        err.print("aborted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
