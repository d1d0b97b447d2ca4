"""Shared by the launch benchmarks: the "by hand" peer, i.e. OpenSSH `ssh` to each lab node running
a command line typed by the user (here: the very line `hrmctl ... --dry-run` prints), in parallel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.nodes import Lab  # noqa: E402


def hrmctl(lab: Lab, *args: str, cwd: Path, popen: bool = False, extra_env: dict | None = None):
    env = dict(os.environ, HRMCTL_INVENTORY=str(lab.inventory), **(extra_env or {}))
    cmd = [sys.executable, "-m", "cli", *args]
    if popen:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                bufsize=1)
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"hrmctl {' '.join(args)} failed ({res.returncode}): {res.stderr[-500:]}")
    return res


def planned_commands(lab: Lab, command: str, args: list[str], cwd: Path) -> dict[str, str]:
    """node -> the exact shell line hrmctl would run there (from --dry-run --json)."""
    doc = json.loads(hrmctl(lab, command, "--dry-run", "--json", *args, cwd=cwd).stdout)
    return {n["node"]: n["command"] for n in doc["nodes"]}


class InventoryNodes:
    """Real machines of an inventory, where a benchmark would otherwise make a lab: the same
    attributes the benchmarks use (inventory, node(name).ip/.user, python), and nothing to set up."""

    def __init__(self, inventory: str, names: list[str]):
        from cli.nodes.inventory import load_inventory

        self.inventory = Path(inventory).expanduser().resolve()
        self.nodes = {n.name: n for n in load_inventory(str(self.inventory)).select(",".join(names))}
        self.names = list(self.nodes)

    def up(self) -> "InventoryNodes":
        return self

    def down(self) -> None:
        pass

    def node(self, name: str):
        return self.nodes[name]

    def python_of(self, name: str) -> str:
        return self.nodes[name].python

    def address(self, name: str) -> str:
        return self.nodes[name].host

    def ssh_args(self, name: str) -> list[str]:
        n = self.nodes[name]
        args = ["-p", str(n.port)] + [a for key in n.identity_file[:1] for a in ("-i", key)]
        args += [a for kh in n.known_hosts[:1] for a in ("-o", f"UserKnownHostsFile={kh}")]
        return args + [f"{n.user}@{n.host}"]


def ssh_args(lab, name: str) -> list[str]:
    if isinstance(lab, InventoryNodes):
        return lab.ssh_args(name)
    n = lab.node(name)
    return ["-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}", f"{n.user}@{n.ip}"]


def python_of(lab, name: str) -> str:
    return lab.python_of(name) if isinstance(lab, InventoryNodes) else lab.python


def address(lab, name: str) -> str:
    return lab.address(name) if isinstance(lab, InventoryNodes) else lab.node(name).ip


def ssh_popen(lab, node: str, line: str) -> subprocess.Popen:
    return subprocess.Popen(["ssh", "-tt", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                             "-o", "LogLevel=ERROR", *ssh_args(lab, node), line],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)


def pin_nodes(lab: Lab) -> None:
    """Lab only: node i's sshd, and so everything started on that node, on core i, so each node is a
    machine of its own (one core each here) instead of two nodes whose ranks fight over the same
    cores, which swings a round's figure by tens of percent."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < len(lab.nodes):
        return
    for node, core in zip(lab.nodes, cores):
        os.sched_setaffinity(node.sshd.pid, {core})
    print(f"nodes pinned: {', '.join(f'{n.name} on core {c}' for n, c in zip(lab.nodes, cores))}", file=sys.stderr)
