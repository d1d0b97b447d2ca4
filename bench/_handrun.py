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

from tests.lab import Lab  # noqa: E402


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


def ssh_popen(lab: Lab, node: str, line: str) -> subprocess.Popen:
    n = lab.node(node)
    return subprocess.Popen(["ssh", "-tt", "-i", str(lab.key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
                             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
                             f"{n.user}@{n.ip}", line],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
