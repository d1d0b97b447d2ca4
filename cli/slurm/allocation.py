"""Inside a Slurm allocation: its nodes, as the launch's nodes (cli/launch/plan/options.py takes them when --nodes is
not given and SLURM_JOB_ID is set). Each is reached with srun (cli/nodes/srun.py), runs this same Python from this same
directory (the cluster's shared file system), and gets one process per GPU Slurm gave it (else one); the first
node is the master, its address Slurm's NodeAddr."""

from __future__ import annotations

import functools
import getpass
import os
import shutil
import subprocess
import sys
from typing import Callable

from cli.errors import HrmctlError
from cli.nodes.inventory import Node

SLURMD_PORT = 6818  # Slurm's default SlurmdPort: a TCP port every node listens on (doctor's round trips time it)
INSTALL_HINT = "run hrmctl on the cluster's login node, where Slurm's commands are (Debian: apt-get install slurm-client)"


def allocation_id() -> str | None:
    """The job id of the allocation this process runs in (salloc, sbatch), or None."""
    return os.environ.get("SLURM_JOB_ID") or None


def need(tool: str) -> str:
    """The path of a Slurm command, or one line saying it is missing (exit code 2)."""
    path = shutil.which(tool)
    if path is None:
        raise HrmctlError(f"{tool} not found: this machine has no Slurm commands; {INSTALL_HINT}")
    return path


def slurm(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    """A Slurm command run here (its output as text); a missing command is one clear line."""
    need(argv[0])
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HrmctlError(f"`{argv[0]}` did not answer in {timeout:g}s: is slurmctld up? (`scontrol ping`)") from None


def nodes_or_allocation(nodes: str | None, from_inventory: Callable[[], list[Node]]) -> list[Node]:
    """doctor's and top's nodes: inside an allocation without --nodes, the allocation's; else the inventory's."""
    job = allocation_id() if nodes is None else None
    return allocation_nodes(job) if job else from_inventory()


def allocation_nodes(job_id: str) -> list[Node]:
    """The allocation's nodes, in Slurm's order (the first is the master)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise HrmctlError(f"SLURM_JOB_ID={job_id} is set but SLURM_JOB_NODELIST is not: start hrmctl inside the "
                          "allocation (salloc, or the batch script), or give --nodes to use the inventory")
    names, addrs = _names_and_addresses(nodelist)
    src = f"Slurm allocation {job_id}"
    return [Node(name=n, host=addrs.get(n, n), user=getpass.getuser(), port=SLURMD_PORT, python=sys.executable,
                 workdir=os.getcwd(), data_dir="data", nproc="auto", slurm_job=job_id,
                 sources={k: src for k in ("host", "user", "python", "workdir", "data_dir", "nproc")})
            for n in names]


@functools.lru_cache(maxsize=4)
def _names_and_addresses(nodelist: str) -> tuple[list[str], dict[str, str]]:
    """The node names of a Slurm node list and their addresses, asked once per process (a batch job's hrmctl asks
    first to hold torchrun, cli/slurm/job.py, then for the launch's options)."""
    res = slurm(["scontrol", "show", "hostnames", nodelist])
    names = res.stdout.split()
    if res.returncode != 0 or not names:
        raise HrmctlError(f"scontrol show hostnames {nodelist}: {_last_line(res)}")
    return names, node_addresses(names)


def node_addresses(names: list[str]) -> dict[str, str]:
    """{node: NodeAddr} from `scontrol show node -o` (one line per node); a node without one keeps its name."""
    res = slurm(["scontrol", "show", "node", "-o", ",".join(names)])
    addrs = {}
    for line in res.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("NodeName") and fields.get("NodeAddr"):
            addrs[fields["NodeName"]] = fields["NodeAddr"]
    return addrs


def _last_line(res: subprocess.CompletedProcess) -> str:
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {res.returncode}"


def requeue(job_id: str, err) -> None:
    """The job back into Slurm's queue (its script was submitted with --requeue): its next start resumes from the
    run's last checkpoint. Slurm ends this job's processes, this one among them."""
    err.print(f"hrmctl: Slurm's time-limit signal: requeueing job {job_id}; its next start resumes from the run's "
              "last checkpoint", markup=False, highlight=False, soft_wrap=True)
    res = slurm(["scontrol", "requeue", job_id])
    if res.returncode != 0:
        err.print(f"error: scontrol requeue {job_id}: {_last_line(res)}", markup=False, highlight=False, soft_wrap=True)
