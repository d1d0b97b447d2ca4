"""Whether the kernel's OOM killer took a rank that died of SIGKILL: its count of kills, read on the node when an
attempt starts and again after the kill.

The count is the one of the memory cgroup the node's commands run in (``/proc/self/cgroup``): a command run through
the session that started the job runs where the job runs (an SSH connection's commands share its sshd, and so its
login session's cgroup; a local job shares this process's). cgroup v1 counts in ``memory.oom_control`` the kills of
its own group's processes, v2 in ``memory.events`` those of its group and the groups below. So a process killed
elsewhere on the machine (another user's, another container's) is not taken for the job's. Where that cannot be read
(no memory controller, a cgroup path this mount does not show) and on a Slurm allocation's nodes (each ``srun`` step
has a cgroup of its own, the training's not the one a check runs in), the machine's count: ``oom_kill`` in
/proc/vmstat (Linux 4.13 and later).
"""

from __future__ import annotations

import threading

from cli.nodes.remote import Session

# prints "<where the count was read> <count>", or nothing; argv[1] "machine": /proc/vmstat's alone
COUNT_SNIPPET = r"""
import sys


def count(path, key):
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k == key and v.strip().isdigit():
                    return int(v)
    except OSError:
        pass
    return None


def cgroup_files():
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:  # v1 "N:memory:/path" (memory alone or with others), v2 "0::/path"
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            yield "/sys/fs/cgroup/memory" + path.rstrip("/") + "/memory.oom_control"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and path != "/":  # v2's root group has no memory.events
            yield "/sys/fs/cgroup" + path.rstrip("/") + "/memory.events"


files = [] if sys.argv[1:] == ["machine"] else list(cgroup_files())
for path in files + ["/proc/vmstat"]:
    n = count(path, "oom_kill")
    if n is not None:
        print(path, n)
        break
"""


def oom_kill_count(session: Session, machine: bool = False) -> tuple[str, int] | None:
    """(where it was read, the count of processes the OOM killer has killed there): the cgroup of the session's
    commands, else the machine's (always, with ``machine``); None when it cannot be read."""
    try:
        res = session.run_python(COUNT_SNIPPET, ["machine"] if machine else [], timeout=10)
    except Exception:  # a lost connection, a node without /proc: no answer
        return None
    where, _, n = res.stdout.strip().rpartition(" ") if res.ok else ("", "", "")
    return (where, int(n)) if where and n.isdigit() else None


class OomCounts:
    """Every node's OOM-kill count at the start of an attempt, read in the background (the trainer takes
    seconds to start, an OOM kill cannot come before); ``grew(node)`` reads it again after a SIGKILL, from the same
    place. ``machine``: the nodes whose count is the machine's (a Slurm allocation's)."""

    def __init__(self, sessions: dict[str, Session], names: list[str], machine: set[str] = frozenset()):
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
