"""A real Slurm cluster over a Lab's nodes, for the cluster tier (tests/cluster/test_slurm.py) and bench/slurm.py.

Debian's slurm-wlm 22.05: one munged and one slurmctld on this machine (the root namespace: the bridge's
address is the controller's), and one slurmd per lab node, inside the node's network namespace with the node's
hostname (a UTS namespace, as its sshd has), registered as ``NodeName=nodeX NodeHostname=nodeX NodeAddr=<its IP>``
(``slurmd -N nodeX``: several slurmds on one host). Everything lives in ``<lab dir>/slurm``: the munge key and
socket, slurm.conf (clients find it through SLURM_CONF, see ``env()``; /etc/slurm is left alone), the state, the
spools and the logs. The controller's port is a free one, so two engineers' labs do not meet. No accounting
daemon (slurmdbd): sacct has nothing, as on a cluster without accounting.

Jobs run as the submitting user; the tests submit as root, from this checkout (the cluster's shared file
system: every node sees the same /work, as a cluster's nodes see the same $HOME).

    with LabSlurm(lab) as slurm:           # lab is up
        subprocess.run(["sinfo"], env=slurm.env())
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from lab.nodes import Lab, sh

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "salloc")
# slurmd starts its cgroup plugin even when nothing is tracked or confined with cgroups (proctrack/linuxproc,
# task/none), and `ip netns exec` gives it a /sys without the cgroup file systems: mounted again in its own mount
# namespace, the v1 hierarchies this machine has (the lab's nodes see their memory cgroup the same way).
MOUNT_CGROUPS = ("mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup && for c in memory cpuset freezer cpu,cpuacct; do "
                 "mkdir -p /sys/fs/cgroup/$c && mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c; done; ")
# Slurm holds a requeued job until the credentials of its last start have expired (120 s by default): the lab's
# expire sooner, so that the tests' requeued job starts again within seconds.
CRED_EXPIRE_S = 10
APT_PACKAGES = "munge slurmctld slurmd slurm-client"


def missing_slurm() -> str | None:
    """Why a lab Slurm cannot be made here, or None."""
    for tool in SLURM_TOOLS:
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed (apt-get install {APT_PACKAGES})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class LabSlurm:
    def __init__(self, lab: Lab, cpus: int | None = None):
        self.lab = lab
        self.dir = lab.dir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.socket = self.dir / "munge" / "munge.socket"
        self.cpus = cpus or os.cpu_count() or 1
        self.procs: list[subprocess.Popen] = []
        self.port = _free_port()

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment a Slurm command of this cluster needs: SLURM_CONF (which names the munge socket)."""
        return dict(os.environ if base is None else base, SLURM_CONF=str(self.conf))

    # ------------------------------------------------------------ setup
    def up(self) -> "LabSlurm":
        for sub in ("munge", "state", "log", *(f"spool/{n.name}" for n in self.lab.nodes)):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "munge", 0o755)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._write_conf()
        munge_dir = self.dir / "munge"
        self._start("munged", [_tool("munged"), "--foreground", "--force", f"--key-file={key}",
                               f"--socket={self.socket}", f"--pid-file={munge_dir}/munged.pid",
                               f"--seed-file={munge_dir}/munged.seed", f"--log-file={self.dir}/log/munged.log"])
        self._wait(lambda: self.socket.exists(), "munged did not create its socket")
        self._start("slurmctld", [_tool("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self._ping(), "slurmctld did not answer")
        for node in self.lab.nodes:
            self._start(f"slurmd-{node.name}",
                        ["ip", "netns", "exec", node.ns, "unshare", "--uts", "sh", "-c",
                         f"hostname {node.name} && {MOUNT_CGROUPS}exec {_tool('slurmd')} -D -N {node.name} -f {self.conf}"])
        self._wait(self._all_idle, "the slurmds did not register")
        return self

    def _write_conf(self) -> None:
        d, lab = self.dir, self.lab
        (d / "plugstack.conf").write_text("")
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        nodes = "".join(f"NodeName={n.name} NodeHostname={n.name} NodeAddr={n.ip} CPUs={self.cpus} State=UNKNOWN\n"
                        for n in lab.nodes)
        self.conf.write_text(
            f"ClusterName=hrmlab{lab.token}\nSlurmctldHost={socket.gethostname()}({lab.subnet}.1)\n"
            f"SlurmctldPort={self.port}\nSlurmdPort=6818\nSlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={self.socket},cred_expire={CRED_EXPIRE_S}\n"
            f"StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n"
            f"SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd-%n.log\n"
            f"PlugStackConfig={d}/plugstack.conf\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
            "SchedulerType=sched/backfill\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
            "JobCompType=jobcomp/none\nReturnToService=2\nSlurmdTimeout=30\nKillWait=20\nMinJobAge=600\n"
            "SchedulerParameters=sched_interval=1\nMessageTimeout=10\n"
            f"{nodes}PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")

    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / "log" / f"{name}.out", "ab")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                           env=self.env(), start_new_session=True))

    def _wait(self, ready, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        logs = {p.name: p.read_text()[-400:] for p in (self.dir / "log").glob("*") if p.is_file()}
        raise RuntimeError(f"{what}: {logs}")

    def _ping(self) -> bool:
        return sh(["scontrol", "ping"], check=False, env=self.env()).stdout.count("UP") > 0

    def _all_idle(self) -> bool:
        out = sh(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, env=self.env()).stdout.split()
        states = dict(zip(out[::2], out[1::2]))
        return len(states) == len(self.lab.nodes) and all(s == "idle" for s in states.values())

    # ------------------------------------------------------------ teardown
    def down(self) -> None:
        """Every job cancelled, then the daemons stopped (slurmds first, munged last)."""
        sh(["scancel", "--full", "--user=root", "--quiet"], check=False, env=self.env(), timeout=20)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)

    def __enter__(self) -> "LabSlurm":
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc) -> None:
        self.down()
