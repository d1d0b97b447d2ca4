"""Whether the kernel's OOM killer took a rank that died of SIGKILL: its count of kills, read on the node when an
attempt starts and again after the kill.

The count is the one of the memory cgroup the node's commands run in (node.cgroups.oom_kills, through the node probe
run with ``--oom-kills``): a command run through the session that started the job runs where the job runs (an SSH
connection's commands share its sshd, and so its login session's cgroup; a local job shares this process's). So a
process killed elsewhere on the machine (another user's, another container's) is not taken for the job's. Where
that cannot be read, and on a Slurm allocation's nodes (each ``srun`` step has a cgroup of its own, the training's
not the one a check runs in), the machine's count (/proc/vmstat).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection

from cli.nodes.remote import Session
from node.ship import program


def oom_kill_count(session: Session, machine: bool = False) -> tuple[str, int] | None:
    """(where it was read, the count of processes the OOM killer has killed there): the cgroup of the session's
    commands, else the machine's (always, with ``machine``); None when it cannot be read."""
    try:
        res = session.run_python(program("probe"), ["--oom-kills", "machine" if machine else "cgroup"], timeout=10)
        found = json.loads(res.stdout)["oom_kills"] if res.ok else None
    except Exception:  # a lost connection, a node without /proc, an answer that is not the probe's: no count
        return None
    return (found[0], found[1]) if found else None


class OomCounts:
    """Every node's OOM-kill count at the start of an attempt, read in the background (the trainer takes
    seconds to start, an OOM kill cannot come before); ``grew(node)`` reads it again after a SIGKILL, from the same
    place. ``machine``: the nodes whose count is the machine's (a Slurm allocation's)."""

    def __init__(self, sessions: dict[str, Session], names: list[str], machine: Collection[str] = ()):
        self.sessions, self.machine, self.before = sessions, machine, {}
        self.thread = threading.Thread(target=self._read, args=(names,), daemon=True)
        self.thread.start()

    def _read(self, names: list[str]) -> None:
        for name in names:
            self.before[name] = oom_kill_count(self.sessions[name], name in self.machine)

    def grew(self, name: str) -> bool:
        self.thread.join(15)
        before = self.before.get(name)
        after = oom_kill_count(self.sessions[name], name in self.machine) if before is not None else None
        return before is not None and after is not None and after[0] == before[0] and after[1] > before[1]
