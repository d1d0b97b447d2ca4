"""Real nodes on this machine for the cluster tier and the benchmarks.

A Lab is N Linux network namespaces joined by a bridge. Each node has its own address, its own
hostname (a UTS namespace around its sshd) mapped to that address in its own hosts file, an
OpenSSH server, its own Unix user and home directory, and a copy of the project in ~/hrmctl.
The client side (this process, in the root namespace) gets a generated key, a known_hosts file
and an inventory that points at the nodes. Teardown removes only what the lab made, by the PIDs,
namespace, link and user names it created.

Faults are made for real inside a node's namespace: `node.netns(["iptables", ...])`,
`node.netns(["tc", ...])`, or a shifted wall clock for the node's SSH sessions with
`node.shift_clock(seconds)` (libfaketime through ~/.ssh/environment).

Root only. Run `python -m tests.lab up 3` to keep a lab for manual work (`down TOKEN` removes it).
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

ROOT = Path(__file__).resolve().parents[1]
STATE_DIR = Path("/run/hrmctl-lab")
NODE_VENV = Path(os.environ.get("HRMCTL_NODE_VENV", "/opt/hrmctl-nodevenv"))
# What the nodes' Python needs to run the probe and the trainer from a copy of the project.
NODE_REQUIREMENTS = ["torch==2.13.0", "numpy", "safetensors", "transformers", "tokenizers", "datasets", "psutil"]
SYSTEM_PYTHON = "/usr/bin/python3"  # root's default python3 lives under /root (mode 700)
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.egg-info", "runs", "data", ".venv", ".pytest_cache", "build")


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


def ensure_node_venv() -> Path:
    """The venv the nodes run (made from /usr/bin/python3, readable by every node user)."""
    python = NODE_VENV / "bin" / "python"
    lock_path = Path(str(NODE_VENV) + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and sh([str(python), "-c", "import torch, numpy, safetensors"], check=False).returncode == 0:
            return python
        sh([SYSTEM_PYTHON, "-m", "venv", "--clear", str(NODE_VENV)])
        sh([str(python), "-m", "pip", "install", "-q", *NODE_REQUIREMENTS], timeout=1800)
        os.chmod(NODE_VENV, 0o755)
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

    def netns(self, argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a command as root inside this node's network namespace."""
        return sh(["ip", "netns", "exec", self.ns, *argv], check=check, **kw)

    def as_user(self, script: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a shell script as the node's user, inside its namespace (not through SSH)."""
        return sh(["ip", "netns", "exec", self.ns, "runuser", "-u", self.user, "--", "sh", "-c",
                   f"cd {self.home} && {script}"], check=check)

    def shift_clock(self, seconds: float | None) -> None:
        """Shift the wall clock that the node's SSH sessions see (None: undo)."""
        env = self.home / ".ssh" / "environment"
        if seconds is None:
            env.unlink(missing_ok=True)
            return
        env.write_text(f"LD_PRELOAD={FAKETIME_LIB}\nFAKETIME={seconds:+g}\nFAKETIME_DONT_FAKE_MONOTONIC=1\n")
        shutil.chown(env, self.user, self.user)

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
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / f"{self.token}.json").write_text(json.dumps({"pid": os.getpid(), "n": self.n}))
        self.dir.mkdir(mode=0o700)
        python = self.python or str(ensure_node_venv())
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
        node = LabNode(name=name, ip=f"{self.subnet}.{11 + i}", ns=ns, user=user, home=Path(f"/home/{user}"),
                       dir=self.dir / name)
        node.dir.mkdir()
        veth = f"hrv{self.token}{i}"
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
        workdir = node.home / "hrmctl"
        shutil.copytree(ROOT, workdir, ignore=COPY_IGNORE, symlinks=True)
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
             f"hostname {node.name} && exec /usr/sbin/sshd -D -e -f {node.dir}/sshd_config"],
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
                f'python = "{self.python}"\nworkdir = "~/hrmctl"\ndata_dir = "~/hrmctl/data"\n{extra_defaults}\n')
        for n in self.nodes:
            text += f'[nodes.{n.name}]\nhost = "{n.ip}"\nuser = "{n.user}"\n\n'
        self.inventory.write_text(text)
        return self.inventory

    def node(self, name: str) -> LabNode:
        return next(n for n in self.nodes if n.name == name)

    # ------------------------------------------------------------ teardown
    def down(self) -> None:
        for node in self.nodes:
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
    (STATE_DIR / f"{token}.json").unlink(missing_ok=True)


def remove_stale() -> None:
    """Remove labs whose owning process is gone (a test run that was killed)."""
    if not STATE_DIR.is_dir():
        return
    for state in STATE_DIR.glob("*.json"):
        token = state.stem
        try:
            info = json.loads(state.read_text())
            os.kill(info["pid"], 0)
            continue  # owner alive
        except (OSError, ValueError, KeyError):
            pass
        n = int(json.loads(state.read_text() or "{}").get("n", 16)) if state.stat().st_size else 16
        _remove(token, [f"hrm{token}n{i}" for i in range(n)], [f"hrm{token}n{i}" for i in range(n)],
                f"hrb{token}", Path(f"/tmp/hrmlab-{token}"))


def _free_subnet() -> str:
    used = sh(["ip", "-4", "-o", "addr"], check=False).stdout
    for _ in range(200):
        cand = f"10.{secrets.choice(range(100, 250))}.{secrets.choice(range(0, 250))}"
        if f" {cand}." not in used:
            return cand
    raise RuntimeError("no free 10.x.y.0/24 subnet for a lab")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "up":
        lab = Lab(int(sys.argv[2])).up()
        STATE_DIR.joinpath(f"{lab.token}.json").write_text(json.dumps({"pid": 1, "n": lab.n}))  # keep it
        print(json.dumps({"token": lab.token, "inventory": str(lab.inventory),
                          "nodes": {n.name: n.ip for n in lab.nodes}}))
    elif len(sys.argv) >= 3 and sys.argv[1] == "down":
        tok = sys.argv[2]
        n = json.loads((STATE_DIR / f"{tok}.json").read_text()).get("n", 16)
        _remove(tok, [f"hrm{tok}n{i}" for i in range(n)], [f"hrm{tok}n{i}" for i in range(n)], f"hrb{tok}",
                Path(f"/tmp/hrmlab-{tok}"))
    else:
        print("usage: python -m tests.lab up N | down TOKEN", file=sys.stderr)
        sys.exit(2)
