"""Real nodes on this machine for the cluster tier (tests/cluster) and the benchmarks (bench/).

A Lab is N Linux network namespaces joined by a bridge. Each node has its own address, its own
hostname (a UTS namespace around its sshd) mapped to that address in its own hosts file, an
OpenSSH server, its own Unix user and home directory, and a copy of the project in ~/hrmctl.
The client side (this process, in the root namespace) gets a generated key, a known_hosts file
and an inventory that points at the nodes. Teardown removes only what the lab made, by the PIDs,
namespace, link and user names it created.

Faults are made for real inside a node's namespace: `node.netns(["iptables", ...])`,
`node.netns(["tc", ...])`, or a shifted wall clock for the node's SSH sessions with
`node.shift_clock(seconds)` (libfaketime through ~/.ssh/environment), or the whole node asleep with
`node.freeze(True)` (SIGSTOP to every process of its namespace, sshd too; `freeze(False)` wakes it). Two kinds of shaping are
built in:

- `node.shape_link(rate_mbit, delay_ms=0.0)` shapes the node's link in both directions: an HTB
  rate limit (burst >= 64 KiB, one GSO packet; a byte FIFO of >= 50 ms of the rate) on the node's
  egress (eth0 inside its namespace) and on its ingress (the egress of its veth peer on the bridge,
  `node.veth`). `delay_ms` is ROUND-TRIP time: it is added once, to the packets arriving at the
  node, so any RTT through this link grows by delay_ms (two shaped nodes: by the sum of both).
  The delay is a netem leaf on the ingress side where the kernel has netem, else (this machine's
  kernel has no netem) the NFQUEUE delayer of lab/nfq_delay.py, run as root in the namespace on
  queue DELAY_QUEUE. `shape_link(None)` removes all of it; each call replaces the previous one.
- `node.limit_cpu(cpus="0", quota=0.5)` puts every process of the node's namespace (sshd, and so
  every later SSH session) into cgroup v1 cpuset and cpu groups named `hrmlab-<token>-<node>`:
  `cpuset.cpus` pins them, `cpu.cfs_quota_us` = quota x 100 ms period caps them (0.5: half a core).
  `limit_cpu()` lifts both. `lab.pin_cores()` pins node i to core i mod the number of cores.
  Processes started later with `node.netns()`/`node.as_user()` come from this process's cgroup and
  are NOT limited; go through SSH, or call limit_cpu again. `Lab.down()`, `remove_stale()` and
  `down TOKEN` remove the groups.
- `node.limit_memory(600 * 2**20)` caps the memory of every process of the node's namespace, together, with
  the cgroup v1 memory controller (group `hrmlab-<token>-<node>`, `memory.limit_in_bytes`; this machine has
  no swap, so past the cap the kernel's OOM killer SIGKILLs the largest process of the group).
  `limit_memory(None)` lifts it. Each node's sshd sees the memory hierarchy at /sys/fs/cgroup/memory (mounted
  in its mount namespace: `ip netns exec` mounts a /sys of its own without the cgroup file systems), so the
  node's processes can read their cap, as on a real machine or container. Removed with the CPU groups.

Root only. Run `python -m lab up 3` to keep a lab for manual work (`down TOKEN` removes it).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab import forked_ranks

ROOT = Path(__file__).resolve().parents[1]
STATE_DIR = Path("/run/hrmctl-lab")
NODE_VENV = Path(os.environ.get("HRMCTL_NODE_VENV", "/opt/hrmctl-nodevenv"))
# What the nodes' Python needs to run the probe and the trainer from a copy of the project.
NODE_REQUIREMENTS = ["torch==2.13.0", "numpy", "safetensors", "transformers", "tokenizers", "datasets", "psutil", "pyyaml"]
SYSTEM_PYTHON = "/usr/bin/python3"
BARE_PYTHON = "~/hrmctl/.venv/bin/python"  # a bare lab's inventory: the venv `hrmctl setup` builds (as hrmctl init writes)  # root's default python3 lives under /root (mode 700)
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
CGROUP_ROOT = Path("/sys/fs/cgroup")  # cgroup v1: one hierarchy per controller
CGROUP_CONTROLLERS = ("cpuset", "cpu")  # limit_cpu's
MEMORY_CONTROLLER = "memory"  # limit_memory's; removed with the others (LAB_CGROUP_CONTROLLERS)
LAB_CGROUP_CONTROLLERS = CGROUP_CONTROLLERS + (MEMORY_CONTROLLER,)
# A quota is enforced per period: with the kernel's default of 100 ms, a node at half a core runs 50 ms and is
# then frozen for 50 ms, which stalls every collective that waits on it by up to 50 ms; at 10 ms the node is
# a uniformly slower core, as a slower laptop is (the balance bench lost 0.05 s a DDP step to the freezes).
CFS_PERIOD_US = 10_000
# In the sshd's own mount namespace (made by `ip netns exec`, whose fresh /sys has no cgroup file systems): the
# memory hierarchy where a real machine has it, read-only, so a node's processes can see their memory cap.
# Best effort: a machine without it simply shows none, as before.
MOUNT_MEMORY_CGROUP = ("{ mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup && mkdir -p /sys/fs/cgroup/memory && "
                       "mount -t cgroup -o ro,memory cgroup /sys/fs/cgroup/memory; } 2>/dev/null; ")
DELAY_QUEUE = 4711  # NFQUEUE number of shape_link's delayer (lab/nfq_delay.py's own default is 7)
NFQ_DELAY = Path(__file__).with_name("nfq_delay.py")
# Caches other test processes write while a lab copies the checkout: a file they remove mid-copy failed a CI run
# (2026-11-28, hypothesis's .hypothesis/constants/.tmp-*).
_IGNORE_ANYWHERE = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", ".hypothesis", ".mypy_cache",
                                          ".ruff_cache")
_IGNORE_AT_TOP = {"runs", "data", ".venv", "build"}  # the checkout's own outputs; cli/runs/ is code


def COPY_IGNORE(directory: str, names: list[str]) -> set[str]:
    """What the lab leaves out when it copies this checkout onto a node (shutil.copytree's ignore)."""
    top = Path(directory).resolve() == ROOT.resolve()
    return set(_IGNORE_ANYWHERE(directory, names)) | ({n for n in names if n in _IGNORE_AT_TOP} if top else set())


def sh(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, **kw)


def missing_capability() -> str | None:
    """Why a lab cannot be made here, or None."""
    if os.geteuid() != 0:
        return "the cluster tier needs root (network namespaces, users, sshd)"
    for tool in ("ip", "/usr/sbin/sshd", "ssh-keygen", "useradd", "unshare", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 openssh-server iptables passwd util-linux)"
    if not Path(SYSTEM_PYTHON).exists():
        return f"{SYSTEM_PYTHON} is missing (the nodes' venv is made from it)"
    return None


STAMP_NAME = "hrmctl-lab-venv.json"  # in a lab venv: what it was made with, written once it was


def _venv_ready(venv: Path, made_with: dict, check: str) -> bool:
    """Whether ``venv`` was made with what ``made_with`` lists: its stamp says so (read, not a Python started: every
    lab asks, and an interpreter importing torch to answer costs 1.4 s of CPU); a stamp that lists anything else is
    not (the venv is made again); a venv from before stamps is ready when its Python imports ``check`` (as it was
    asked before), and is then stamped. Delete the venv to have it made again."""
    python, stamp = venv / "bin" / "python", venv / STAMP_NAME
    if not python.exists():
        return False
    if stamp.exists():
        try:
            return json.loads(stamp.read_text()) == made_with
        except (OSError, ValueError):
            return False
    if sh([str(python), "-c", check], check=False).returncode != 0:
        return False
    _stamp(venv, made_with)
    return True


def _stamp(venv: Path, made_with: dict) -> None:
    (venv / STAMP_NAME).write_text(json.dumps(made_with))


def ensure_node_venv() -> Path:
    """The venv the nodes run (made from /usr/bin/python3, readable by every node user)."""
    python = NODE_VENV / "bin" / "python"
    made_with = {"python": SYSTEM_PYTHON, "packages": NODE_REQUIREMENTS}
    lock_path = Path(str(NODE_VENV) + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _venv_ready(NODE_VENV, made_with, "import torch, numpy, safetensors, yaml"):
            sh([SYSTEM_PYTHON, "-m", "venv", "--clear", str(NODE_VENV)])
            sh([str(python), "-m", "pip", "install", "-q", *NODE_REQUIREMENTS], timeout=1800)
            os.chmod(NODE_VENV, 0o755)
            _stamp(NODE_VENV, made_with)
        _hook_forked_ranks(python)
    return python


# a .pth file's line that starts with "import" is run as the interpreter starts: the module loaded in an agent only
# (a cheap gate on the command line: every node process runs it), and its activate decides
PTH_LINE = (f"import sys; any(a in {forked_ranks.GATE!r} for a in getattr(sys, 'orig_argv', [])[:4]) and "
            f"__import__('hrmlab_forked_ranks').activate()\n")


def _hook_forked_ranks(python: Path) -> None:
    """lab/forked_ranks.py in the nodes' venv, activated as each of its interpreters starts (a .pth file's import
    line): the lab's torchrun agents fork their ranks (the suite's start-up, never the product's). Written anew each
    time (the venv outlives checkouts)."""
    site = Path(sh([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    source = Path(forked_ranks.__file__).read_text()
    for name, text in (("hrmlab_forked_ranks.py", source),
                       ("hrmlab_forked_ranks.pth", PTH_LINE)):
        if not (site / name).exists() or (site / name).read_text() != text:
            tmp = site / (name + ".tmp")
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.rename(site / name)


CLI_VENV = Path(os.environ.get("HRMCTL_NODE_CLI_VENV", "/opt/hrmctl-nodecli"))
CLI_PACKAGES = ["typer", "rich", "paramiko", "msgspec"]  # what hrmctl needs beyond the nodes' own venv


def ensure_cli_venv() -> Path:
    """A venv from which a node's user can run hrmctl itself (a node acting as the machine you type on): the nodes'
    venv (torch, psutil, ...) seen through a .pth file, and the CLI's own packages at this machine's versions."""
    from importlib.metadata import PackageNotFoundError, version

    node_python = ensure_node_venv()
    python = CLI_VENV / "bin" / "python"
    pins = []
    for name in CLI_PACKAGES:
        try:
            pins.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            pins.append(name)
    made_with = {"python": SYSTEM_PYTHON, "packages": pins, "beside": str(NODE_VENV)}
    lock_path = Path(str(CLI_VENV) + ".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _venv_ready(CLI_VENV, made_with, "import typer, rich, paramiko, msgspec, torch, psutil"):
            return python
        sh([SYSTEM_PYTHON, "-m", "venv", "--clear", str(CLI_VENV)])
        site = sh([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        node_site = sh([str(node_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout
        Path(site, "hrmctl-node-venv.pth").write_text(node_site.strip() + "\n")
        sh([str(python), "-m", "pip", "install", "-q", *pins], timeout=1800)
        os.chmod(CLI_VENV, 0o755)
        _stamp(CLI_VENV, made_with)
    return python


@dataclass
class LabNode:
    name: str
    ip: str
    ns: str
    user: str
    home: Path
    dir: Path
    sshd: subprocess.Popen | None = None
    host_key_line: str = ""
    veth: str = ""  # the root-side end of the node's link, on the bridge
    cgroup: str = ""  # name of its cpuset/cpu cgroups: hrmlab-<token>-<node>
    delayer: subprocess.Popen | None = None  # shape_link's NFQUEUE delayer, when netem is missing
    delay_mechanism: str = ""  # "netem", "nfqueue", or "" (no delay)
    impair: tuple = (0.0, 0.0, 0.0)  # shape_link's (delay_ms, jitter_ms, loss) while it holds

    def netns(self, argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a command as root inside this node's network namespace."""
        return sh(["ip", "netns", "exec", self.ns, *argv], check=check, **kw)

    def as_user(self, script: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a shell script as the node's user, inside its namespace (not through SSH)."""
        return sh(["ip", "netns", "exec", self.ns, "runuser", "-u", self.user, "--", "sh", "-c",
                   f"cd {self.home} && {script}"], check=check)

    def freeze(self, frozen: bool) -> int:
        """Stop (SIGSTOP) or continue (SIGCONT) every process of the node's namespace, its sshd included: a laptop
        that sleeps (no SSH answer, new connections accepted by the kernel but never greeted). The count signalled."""
        pids = [int(p) for p in sh(["ip", "netns", "pids", self.ns]).stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP if frozen else signal.SIGCONT)
            except ProcessLookupError:
                pass
        return len(pids)

    def shift_clock(self, seconds: float | None) -> None:
        """Shift the wall clock that the node's SSH sessions see (None: undo)."""
        env = self.home / ".ssh" / "environment"
        if seconds is None:
            env.unlink(missing_ok=True)
            return
        env.write_text(f"LD_PRELOAD={FAKETIME_LIB}\nFAKETIME={seconds:+g}\nFAKETIME_DONT_FAKE_MONOTONIC=1\n")
        shutil.chown(env, self.user, self.user)

    # ------------------------------------------------------------ link shaping
    def shape_link(self, rate_mbit: float | None, delay_ms: float = 0.0, jitter_ms: float = 0.0,
                   loss: float = 0.0) -> None:
        """Shape this node's link for real, in both directions; replaces any earlier shaping.

        rate_mbit: an HTB limit of rate_mbit x 10^6 bit/s on the node's egress (eth0 inside its
        namespace) AND on its ingress (the egress of its veth peer, `self.veth`, on the bridge side).
        Burst max(64 KiB, 4 ms of the rate): a whole GSO packet must fit, veth passes 64 KiB ones.
        Queue: a byte FIFO of max(256 KiB, 50 ms of the rate), so a TCP flow fills the link rather
        than losing everything past a 1000-packet (or tiny) default. None: no rate limit.

        delay_ms: added ROUND-TRIP time, not one-way: the packets ARRIVING at the node wait delay_ms
        (after the ingress rate limit), the ones it sends do not, so a ping to or from this node
        grows by delay_ms, and between two shaped nodes by the sum of their delays. Made with netem
        where the kernel has it, else with the NFQUEUE delayer (lab/nfq_delay.py, one Python
        process per node, excluded from limit_cpu) -- which also caps what the delayed link can
        carry into the node at what that process passes (~350 Mbit/s measured here). With the
        NFQUEUE delay, ping run ON the delayed node needs -U: its default RTT ends at the reply's
        kernel receive timestamp, taken before the packet is held, so it would not show the delay.

        jitter_ms, loss: the delay varies by up to +-jitter_ms (uniformly; packets keep their order), and a share
        ``loss`` of the arriving packets is dropped: a crowded Wi-Fi (netem's delay D J and loss P%, or the delayer's
        --jitter-ms and --loss).

        shape_link(None) (no rate, no delay) removes all shaping.
        """
        self._unshape()
        if rate_mbit is None and not delay_ms and not loss:
            return
        if rate_mbit is not None and rate_mbit <= 0:
            raise ValueError(f"rate_mbit must be > 0 (or None), not {rate_mbit}")
        if not 0 <= jitter_ms <= delay_ms or not 0 <= loss < 1:
            raise ValueError(f"need 0 <= jitter_ms <= delay_ms and 0 <= loss < 1, not {jitter_ms}, {delay_ms}, {loss}")
        self.impair = (delay_ms, jitter_ms, loss)
        impaired = bool(delay_ms or loss)
        try:
            if rate_mbit is not None:
                self._htb(["ip", "netns", "exec", self.ns, "tc"], "eth0", rate_mbit)
                self._htb(["tc"], self.veth, rate_mbit, netem=impaired)
            elif impaired:
                self._netem(["root", "handle", "1:"])
            if impaired and not self.delay_mechanism:
                self._nfqueue_delay()
        except Exception:
            self._unshape()
            raise

    def _htb(self, tc: list[str], dev: str, rate_mbit: float, netem: bool = False) -> None:
        rate = f"{rate_mbit * 1000:.0f}kbit"  # tc: 1 kbit = 1000 bit/s
        byte_rate = rate_mbit * 1e6 / 8
        burst = max(64 * 1024, int(byte_rate * 0.004))
        limit = max(256 * 1024, int(byte_rate * 0.050))
        quantum = min(200_000, max(1600, int(byte_rate / 10)))
        sh([*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"])
        sh([*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate, "ceil", rate,
            "burst", str(burst), "cburst", str(burst), "quantum", str(quantum)])
        leaf = ["parent", "1:10", "handle", "10:"]
        if not (netem and self._netem(leaf)):
            sh([*tc, "qdisc", "add", "dev", dev, *leaf, "bfifo", "limit", str(limit)])

    def _netem(self, where: list[str]) -> bool:
        """netem with ``impair`` on the root-side veth (the node's ingress); False when the kernel has no netem."""
        delay_ms, jitter_ms, loss = self.impair
        res = sh(["tc", "qdisc", "add", "dev", self.veth, *where, "netem", "delay", f"{delay_ms:g}ms",
                  *([f"{jitter_ms:g}ms"] if jitter_ms else []), *(["loss", f"{loss * 100:g}%"] if loss else []),
                  "limit", "100000"], check=False)
        if res.returncode == 0:
            self.delay_mechanism = "netem"
            return True
        if "unknown" not in res.stderr.lower():
            raise RuntimeError(f"tc netem on {self.veth}: {res.stderr.strip()}")
        return False

    def _nfqueue_delay(self) -> None:
        """No netem in this kernel: hold (and drop) the arriving packets in user space (iptables NFQUEUE)."""
        delay_ms, jitter_ms, loss = self.impair
        with open(self.dir / "delay.log", "ab") as log:
            self.delayer = subprocess.Popen(
                ["ip", "netns", "exec", self.ns, sys.executable, str(NFQ_DELAY), "--queue", str(DELAY_QUEUE),
                 "--delay-ms", f"{delay_ms:g}", "--jitter-ms", f"{jitter_ms:g}", "--loss", f"{loss:g}"],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        line = self.delayer.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the delayer on {self.name} did not start: "
                               f"{(self.dir / 'delay.log').read_text()[-500:]}")
        self.netns(["iptables", "-I", "INPUT", "1", *self._delay_rule()])
        self.delay_mechanism = "nfqueue"

    @staticmethod
    def _delay_rule() -> list[str]:
        return ["-i", "eth0", "-j", "NFQUEUE", "--queue-num", str(DELAY_QUEUE), "--queue-bypass"]

    def _unshape(self) -> None:
        sh(["ip", "netns", "exec", self.ns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        sh(["tc", "qdisc", "del", "dev", self.veth, "root"], check=False)
        while self.netns(["iptables", "-D", "INPUT", *self._delay_rule()], check=False).returncode == 0:
            pass
        self._stop_delayer()
        self.delay_mechanism, self.impair = "", (0.0, 0.0, 0.0)

    def _stop_delayer(self) -> None:
        proc, self.delayer = self.delayer, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait(5)
        if proc.stdout:
            proc.stdout.close()

    # ------------------------------------------------------------ CPU limits
    def limit_cpu(self, cpus: str | None = None, quota: float | None = None) -> None:
        """Limit the CPU of every process of this node's namespace, and so of every later SSH session.

        cpus: a cpuset list ("0", "0-1", "1,3") the processes are pinned to (sched_getaffinity
        shows it); None: all of the parent cpuset's CPUs. quota: CPU time per wall time, for the
        node as a whole (0.5 = half a core, 2 = two cores), as cpu.cfs_quota_us = quota x
        cfs_period_us (10 ms); None: no quota. limit_cpu() lifts both limits (the processes stay
        in the node's groups). Uses the cgroup v1 cpuset and cpu hierarchies, groups
        hrmlab-<token>-<node>; the ids of `ip netns pids` (sshd and all it runs) are moved in,
        each whole process with its threads (cgroup.procs), except shape_link's delayer.
        """
        if quota is not None and quota <= 0:
            raise ValueError(f"quota must be > 0 (or None), not {quota}")
        groups = {c: CGROUP_ROOT / c / self.cgroup for c in CGROUP_CONTROLLERS}
        if cpus is None and quota is None and not any(g.is_dir() for g in groups.values()):
            return  # never limited: nothing to lift
        for group in groups.values():
            group.mkdir(exist_ok=True)
        cpuset, cpu = groups["cpuset"], groups["cpu"]
        parent = cpuset.parent
        (cpuset / "cpuset.mems").write_text((parent / "cpuset.mems").read_text().strip())
        (cpuset / "cpuset.cpus").write_text(cpus if cpus is not None else (parent / "cpuset.cpus").read_text().strip())
        (cpu / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(quota * CFS_PERIOD_US)) if quota is not None else "-1")
        self._enter_cgroups(list(groups.values()))

    # ------------------------------------------------------------ memory cap
    def limit_memory(self, limit_bytes: int | None) -> None:
        """Cap the memory (resident, page cache included, reclaimable cache reclaimed first) of all the
        processes of this node's namespace together at ``limit_bytes``: the cgroup v1 memory group
        hrmlab-<token>-<node>, memory.limit_in_bytes; the ids of `ip netns pids` are moved in as limit_cpu
        moves them (later SSH sessions are forked by sshd, so inside). None lifts the cap (the processes stay
        in the group, unlimited). Raises RuntimeError when this machine has no cgroup v1 memory controller."""
        if limit_bytes is not None and limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be > 0 (or None), not {limit_bytes}")
        hierarchy = CGROUP_ROOT / MEMORY_CONTROLLER
        if not (hierarchy / "memory.limit_in_bytes").exists():
            raise RuntimeError(f"no cgroup v1 memory controller at {hierarchy}")
        group = hierarchy / self.cgroup
        if limit_bytes is None and not group.is_dir():
            return  # never capped: nothing to lift
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes) if limit_bytes is not None else "-1")
        self._enter_cgroups([group])

    def _enter_cgroups(self, groups: list[Path]) -> None:
        skip = {str(self.delayer.pid)} if self.delayer is not None else set()
        for _ in range(10):  # until a listing shows nothing new (a session may fork meanwhile)
            moved = False
            for pid in sh(["ip", "netns", "pids", self.ns], check=False).stdout.split():
                if pid in skip:
                    continue
                for group in groups:
                    if pid in _cgroup_pids(group):
                        continue
                    try:
                        (group / "cgroup.procs").write_text(pid)
                        moved = True
                    except OSError:  # exited meanwhile (ESRCH), or a thread of one already moved
                        pass
            if not moved:
                return

    def set_hostname_loopback(self, on: bool) -> None:
        """The classic trap: the node's hostname resolving to 127.0.1.1 (gloo then binds loopback)."""
        hosts = Path(f"/etc/netns/{self.ns}/hosts")
        lines = [l for l in hosts.read_text().splitlines() if not l.startswith("127.0.1.1")]
        if on:
            lines.insert(1, f"127.0.1.1 {self.name}")
            lines = [l for l in lines if not (l.startswith(self.ip + " ") and l.endswith(" " + self.name))]
        hosts.write_text("\n".join(lines) + "\n")


@dataclass
class Lab:
    n: int
    python: str | None = None
    bare: bool = False  # nodes with an empty home: no project, no venv (what `hrmctl setup` starts from)
    threads: int | None = None  # the inventory's `threads` for every node (None: the launcher's own choice)
    token: str = field(default_factory=lambda: secrets.token_hex(2))
    nodes: list[LabNode] = field(default_factory=list)

    def __post_init__(self):
        self.dir = Path(f"/tmp/hrmlab-{self.token}")
        self.bridge = f"hrb{self.token}"
        self.key = self.dir / "id_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.inventory = self.dir / "hrmctl.toml"
        self.subnet = _free_subnet()

    # ------------------------------------------------------------ setup
    def up(self) -> "Lab":
        write_state(self.token, {"pid": os.getpid(), "n": self.n})
        self.dir.mkdir(mode=0o700)
        python = self.python or (BARE_PYTHON if self.bare else str(ensure_node_venv()))
        self.python = python
        Path("/run/sshd").mkdir(exist_ok=True)
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hrmlab-{self.token}", "-f", str(self.key)])
        sh(["ip", "link", "add", self.bridge, "type", "bridge"])
        sh(["ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge])
        sh(["ip", "link", "set", self.bridge, "up"])
        for i in range(self.n):
            self.nodes.append(self._make_node(i))
        hosts = "127.0.0.1 localhost\n" + "".join(f"{n.ip} {n.name}\n" for n in self.nodes)
        for node in self.nodes:
            Path(f"/etc/netns/{node.ns}").mkdir(parents=True, exist_ok=True)
            Path(f"/etc/netns/{node.ns}/hosts").write_text(hosts)
            # No nameserver: the host's resolver is unreachable from the namespaces, and reverse
            # lookups that wait for it stall c10d's TCPStore (libuv) for ~10 s. Without one they fail at once.
            Path(f"/etc/netns/{node.ns}/resolv.conf").write_text("# hrmctl lab: no DNS server on this LAN\n")
            self._start_sshd(node)
        self._wait_for_sshd()
        self.write_inventory()
        return self

    def _make_node(self, i: int) -> LabNode:
        name = f"node{i}"
        ns = f"hrm{self.token}n{i}"
        user = f"hrm{self.token}n{i}"
        veth = f"hrv{self.token}{i}"
        node = LabNode(name=name, ip=f"{self.subnet}.{11 + i}", ns=ns, user=user, home=Path(f"/home/{user}"),
                       dir=self.dir / name, veth=veth, cgroup=f"hrmlab-{self.token}-{name}")
        node.dir.mkdir()
        sh(["ip", "netns", "add", ns])
        sh(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        sh(["ip", "link", "set", veth, "master", self.bridge, "up"])
        node.netns(["ip", "addr", "add", f"{node.ip}/24", "dev", "eth0"])
        node.netns(["ip", "link", "set", "eth0", "up"])
        node.netns(["ip", "link", "set", "lo", "up"])
        node.netns(["ip", "route", "add", "default", "via", f"{self.subnet}.1"])
        sh(["useradd", "-m", "-d", str(node.home), "-s", "/bin/bash", user])
        sh(["usermod", "-p", "*", user])  # not locked: sshd without PAM refuses locked accounts
        ssh_dir = node.home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        shutil.copy(f"{self.key}.pub", ssh_dir / "authorized_keys")
        if not self.bare:
            shutil.copytree(ROOT, node.home / "hrmctl", ignore=COPY_IGNORE, symlinks=True)
        sh(["chown", "-R", f"{user}:{user}", str(node.home)])
        host_key = node.dir / "ssh_host_ed25519_key"
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)])
        pub = (node.dir / "ssh_host_ed25519_key.pub").read_text().split()
        node.host_key_line = f"{node.ip} {pub[0]} {pub[1]}"
        (node.dir / "sshd_config").write_text(
            f"Port 22\nListenAddress {node.ip}\nHostKey {host_key}\nPidFile {node.dir}/sshd.pid\n"
            "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin no\n"
            f"StrictModes no\nPermitUserEnvironment yes\nAllowUsers {user}\nSubsystem sftp internal-sftp\n"
            "LogLevel ERROR\nMaxStartups 200\nMaxSessions 100\nClientAliveInterval 5\nClientAliveCountMax 3\n"
        )
        return node

    def _start_sshd(self, node: LabNode) -> None:
        log = open(node.dir / "sshd.log", "ab")
        node.sshd = subprocess.Popen(
            ["ip", "netns", "exec", node.ns, "unshare", "--uts", "sh", "-c",
             f"hostname {node.name} && {MOUNT_MEMORY_CGROUP}exec /usr/sbin/sshd -D -e -f {node.dir}/sshd_config"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_for_sshd(self, timeout: float = 20) -> None:
        import socket
        deadline = time.monotonic() + timeout
        pending = list(self.nodes)
        while pending and time.monotonic() < deadline:
            for node in list(pending):
                try:
                    with socket.create_connection((node.ip, 22), timeout=1) as s:
                        if s.recv(4).startswith(b"SSH"):
                            pending.remove(node)
                except OSError:
                    pass
                if node.sshd.poll() is not None:
                    raise RuntimeError(f"sshd on {node.name} exited: {(node.dir / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.05)
        if pending:
            raise RuntimeError(f"sshd did not come up on {[n.name for n in pending]}")

    def write_inventory(self, extra_defaults: str = "") -> Path:
        self.known_hosts.write_text("".join(n.host_key_line + "\n" for n in self.nodes))
        text = (f'known_hosts = "{self.known_hosts}"\n\n[defaults]\nidentity_file = "{self.key}"\n'
                f'python = "{self.python}"\nworkdir = "~/hrmctl"\ndata_dir = "~/hrmctl/data"\n{extra_defaults}\n'
                + (f"threads = {self.threads}\n" if self.threads else ""))
        for n in self.nodes:
            text += f'[nodes.{n.name}]\nhost = "{n.ip}"\nuser = "{n.user}"\n\n'
        self.inventory.write_text(text)
        return self.inventory

    def node(self, name: str) -> LabNode:
        return next(n for n in self.nodes if n.name == name)

    def pin_cores(self, quota: float | None = None) -> None:
        """Pin node i to core i mod the number of cores (of the parent cpuset; os.cpu_count() on a
        whole machine), each with an optional quota; lift with `node.limit_cpu()` on each node."""
        cores = _cpu_list((CGROUP_ROOT / "cpuset" / "cpuset.effective_cpus").read_text())
        for i, node in enumerate(self.nodes):
            node.limit_cpu(cpus=str(cores[i % len(cores)]), quota=quota)

    def give_data(self, local: Path, name: str) -> None:
        """A copy of the directory ``local`` in every node's ~/hrmctl/data/<name>, owned by the node's user (what
        `hrmctl sync-data`, or the trainer's first run there, leaves)."""
        for node in self.nodes:
            data = node.home / "hrmctl" / "data"
            data.mkdir(exist_ok=True)
            shutil.copytree(local, data / name)
            sh(["chown", "-R", f"{node.user}:{node.user}", str(data)])

    # ------------------------------------------------------------ teardown
    def down(self) -> None:
        for node in self.nodes:
            node._stop_delayer()
            if node.sshd is not None and node.sshd.poll() is None:
                os.killpg(node.sshd.pid, signal.SIGTERM)
                try:
                    node.sshd.wait(5)
                except subprocess.TimeoutExpired:
                    os.killpg(node.sshd.pid, signal.SIGKILL)
        _remove(self.token, [n.user for n in self.nodes], [n.ns for n in self.nodes], self.bridge, self.dir)

    def __enter__(self) -> "Lab":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def _remove(token: str, users: list[str], namespaces: list[str], bridge: str, lab_dir: Path) -> None:
    for user in users:
        sh(["pkill", "-KILL", "-u", user], check=False)  # processes of the node users this lab created
    for ns in namespaces:
        for pid in sh(["ip", "netns", "pids", ns], check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        sh(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    sh(["ip", "link", "del", bridge], check=False)
    for user in users:
        sh(["userdel", "-r", "-f", user], check=False)
    shutil.rmtree(lab_dir, ignore_errors=True)
    _remove_cgroups(token)
    (STATE_DIR / f"{token}.json").unlink(missing_ok=True)


def _cgroup_pids(group: Path) -> list[str]:
    try:
        return (group / "cgroup.procs").read_text().split()
    except OSError:
        return []


def _cpu_list(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5]"""
    cores: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            cores.extend(range(int(lo), int(hi or lo) + 1))
    return cores


def lab_cgroups(token: str = "*") -> list[Path]:
    """The cpuset/cpu/memory cgroup directories of lab `token` (all labs: "*") that exist now."""
    found: list[Path] = []
    for controller in LAB_CGROUP_CONTROLLERS:
        found.extend(sorted((CGROUP_ROOT / controller).glob(f"hrmlab-{token}-*")))
    return found


def _remove_cgroups(token: str) -> None:
    """Move whatever is still in the lab's cgroups to the hierarchy's root, then remove them."""
    for group in lab_cgroups(token):
        if not group.is_dir():
            continue  # cpu and cpuset co-mounted: already gone
        for attempt in range(50):
            for pid in _cgroup_pids(group):
                try:
                    (group.parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY: a task still exiting, or one that forked in meanwhile
                time.sleep(0.02)
        else:
            raise RuntimeError(f"could not remove {group}: tasks {_cgroup_pids(group)}")


def write_state(token: str, info: dict) -> None:
    """The lab's state file (its owner's pid, its node count), written whole or not at all: another test process's
    remove_stale may read it at any moment (an empty file would read as a dead owner)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    part = STATE_DIR / f".{token}.json.part"
    part.write_text(json.dumps(info))
    os.replace(part, STATE_DIR / f"{token}.json")


def _owner_alive(info) -> bool:
    try:
        os.kill(info["pid"], 0)
        return True
    except (OSError, KeyError, TypeError):
        return False


def remove_stale() -> None:
    """Remove labs whose owning process is gone (a test run that was killed). Other test processes make and remove
    labs meanwhile: a state file that is gone by the time it is read is a lab its owner removed."""
    for state in STATE_DIR.glob("*.json") if STATE_DIR.is_dir() else []:
        token = state.stem
        try:
            text = state.read_text()
        except FileNotFoundError:
            continue
        try:
            info = json.loads(text)
        except ValueError:
            info = {}
        if _owner_alive(info):
            continue
        n = int(info.get("n", 16)) if isinstance(info, dict) else 16
        _remove(token, [f"hrm{token}n{i}" for i in range(n)], [f"hrm{token}n{i}" for i in range(n)],
                f"hrb{token}", Path(f"/tmp/hrmlab-{token}"))
    # cgroups of a lab whose state file is gone altogether (a lab writes it before anything else)
    for group in lab_cgroups():
        token = group.name.split("-")[1]
        if not (STATE_DIR / f"{token}.json").exists():
            _remove_cgroups(token)


def _free_subnet() -> str:
    used = sh(["ip", "-4", "-o", "addr"], check=False).stdout
    for _ in range(200):
        cand = f"10.{secrets.choice(range(100, 250))}.{secrets.choice(range(0, 250))}"
        if f" {cand}." not in used:
            return cand
    raise RuntimeError("no free 10.x.y.0/24 subnet for a lab")
