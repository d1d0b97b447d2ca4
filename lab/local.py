"""Nodes as processes on this machine, for what needs no network namespace: one torchrun agent per node rank on
127.0.0.1 (static rendezvous, one process each, gloo), started as hrmctl starts a DiLoCo run on a node
(node/torchrun.py --exit-barrier 10), each in a session of its own; and a node's whole process tree
(the agent and the trainer it started, which torchrun puts in a session of its own too) for a SIGSTOP fault.
Used by tests/trainer/test_diloco_leave.py and bench/diloco_leave.py. Standard library only.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {"OMP_NUM_THREADS": "1", "HRMCTL_BACKEND": "gloo", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_agents(trainer_args: list[str], logs: list[Path]) -> list[subprocess.Popen]:
    """One torchrun agent a node (len(logs) nodes, node rank i writing to logs[i]) running auralm's trainer."""
    port, nodes = free_port(), len(logs)
    procs = []
    for rank, log in enumerate(logs):
        cmd = [sys.executable, "-m", "node", "torchrun", "--exit-barrier", "10", "--", f"--nnodes={nodes}",
               f"--node-rank={rank}", "--nproc-per-node=1", "--rdzv-backend=static", "--master-addr=127.0.0.1",
               f"--master-port={port}", "--max-restarts=0", "-m", "auralm.training.train", *trainer_args]
        with log.open("w") as out:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **ENV}, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    return procs


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process under it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def signal_tree(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
