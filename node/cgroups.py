"""What a process may use of its machine, from its cgroups (v1 and v2) and the kernel's files: the CPUs
(``cpu_usable``), the memory left (``cgroup_memory``), the OOM killer's count (``oom_kills``). Standard library only:
the node probe (node/probe.py, sent to a node as source with the rest of node/ by node.ship) reports these, and the
trainer's ``training.batch_size=auto`` (auralm.planning.autobatch) plans with ``cgroup_memory`` on the node itself."""

from __future__ import annotations

import os


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def cgroup_dirs(controller: str, root: str, proc_cgroup: str):
    """(directory, is v1) of this process's cgroup for ``controller`` and each of its ancestors, innermost first:
    /proc/self/cgroup's v1 line naming the controller (under root/controller) or its v2 line (under root)."""
    for line in read(proc_cgroup).splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        v1 = controller in parts[1].split(",")
        if not v1 and parts[1] != "":
            continue
        base = os.path.join(root, controller) if v1 else root
        chain = [c for c in parts[2].strip().split("/") if c]
        for depth in range(len(chain), -1, -1):
            yield os.path.join(base, *chain[:depth]), v1


def cpu_usable(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup",
               environ=os.environ) -> int | None:
    """The CPUs this process may use: its affinity (taskset, a Slurm step's --cpus-per-task, a cpuset), and no more
    than its CPU cgroup's quota or the tightest of its ancestors' (v1 cpu.cfs_quota_us / cfs_period_us, v2
    cpu.max), rounded up, or a Slurm job's SLURM_CPUS_PER_TASK; None when nothing is readable. The machine's count
    overstates it in a container or a shared job, and a launch that gives each rank that many threads then makes
    them spin against each other."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    for group, v1 in cgroup_dirs("cpu", root, proc_cgroup):
        if v1:
            quota, period = (read(os.path.join(group, f"cpu.cfs_{k}_us")).strip() for k in ("quota", "period"))
        else:
            quota, _, period = read(os.path.join(group, "cpu.max")).strip().partition(" ")
        if quota.isdigit() and period.isdigit() and int(period) > 0:
            cap = max(1, -(-int(quota) // int(period)))
            usable = cap if usable is None else min(usable, cap)
    share = environ.get("SLURM_CPUS_PER_TASK", "")  # the job's --cpus-per-task, which a cluster whose TaskPlugin
    if share.isdigit() and int(share) > 0:  # binds nothing (task/none) leaves to the job to keep to
        usable = int(share) if usable is None else min(usable, int(share))
    return usable


def cgroup_memory(root: str = "/sys/fs/cgroup",
                  proc_cgroup: str = "/proc/self/cgroup") -> tuple[int | None, int | None]:
    """(limit, what is left of it) in bytes for this process's memory cgroup or the tightest of its ancestors
    (cgroup v1 memory.limit_in_bytes, v2 memory.max; droppable page cache not counted as used); (None, None)
    with no limit or nothing readable (e.g. /sys/fs/cgroup not mounted where this runs). The node probe
    reports it, and the trainer's batch_size=auto (auralm.planning.autobatch) plans with it."""
    best: tuple[int | None, int | None] = (None, None)
    for group, v1 in cgroup_dirs("memory", root, proc_cgroup):
        names = (("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") if v1 else
                 ("memory.max", "memory.current", "inactive_file"))
        limit, usage = read(os.path.join(group, names[0])).strip(), read(os.path.join(group, names[1])).strip()
        if not (limit.isdigit() and usage.isdigit()) or int(limit) >= 1 << 60:
            continue
        inactive = 0
        for stat in read(os.path.join(group, "memory.stat")).splitlines():
            k, _, v = stat.partition(" ")
            if k == names[2] and v.strip().isdigit():
                inactive = int(v)
        free = max(0, int(limit) - max(0, int(usage) - inactive))
        if best[1] is None or free < best[1]:
            best = (int(limit), free)
    return best


def oom_kills(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup",
              vmstat: str = "/proc/vmstat", machine: bool = False) -> list | None:
    """[where it was read, how many processes the kernel's OOM killer has killed there]: this process's memory
    cgroup, or the nearest of its ancestors whose count is readable (cgroup v1 ``memory.oom_control`` counts its own
    group's kills, v2 ``memory.events`` its group's and those below); else, or with ``machine``, the machine's
    (``oom_kill`` in /proc/vmstat, Linux 4.13 and later); None when nothing is readable. A process of another
    group (another user's session, another container) is not in the group's count (cli/launch/run/oom.py)."""
    places = [] if machine else [os.path.join(group, "memory.oom_control" if v1 else "memory.events")
                                 for group, v1 in cgroup_dirs("memory", root, proc_cgroup)]
    for path in places + [vmstat]:
        for line in read(path).splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill" and v.strip().isdigit():
                return [path, int(v)]
    return None
