"""The `hrmctl doctor` command: check the options, select the nodes, run, render."""

from __future__ import annotations

from rich.console import Console

from cli.doctor.run import run_doctor
from cli.doctor.view import show
from cli.errors import HrmctlError
from cli.nodes.inventory import load_inventory


def doctor(inventory: str | None, nodes: str | None, *, master_port: int, timeout: float, verbose: bool,
           accept_new_host_keys: bool, as_json: bool, console: Console) -> int:
    if not 1 <= master_port <= 65535:
        raise HrmctlError(f"--master-port {master_port} is outside 1-65535; give a free TCP port such as 29500")
    if not timeout > 0:
        raise HrmctlError(f"--timeout {timeout:g} must be a positive number of seconds, e.g. --timeout 30")
    from cli.slurm.allocation import nodes_or_allocation

    selected = nodes_or_allocation(nodes, lambda: load_inventory(inventory).select(nodes))  # an allocation's: srun
    rep = run_doctor(selected, master_port=master_port, timeout=timeout, accept_new_host_keys=accept_new_host_keys)
    return show(rep, console, as_json=as_json, verbose=verbose)
