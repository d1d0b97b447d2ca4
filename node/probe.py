"""The node probe: what one node can do. The standard library and node/cgroups.py (the cgroups' figures, which the
trainer reads too), plus torch and psutil when present (resources come from psutil when the node has it, else from a
minimal stdlib fallback).

It is sent as source to a node's Python with the rest of node/ (`session.run_python(ship.program("probe"),
probe_args(...))`, netcheck/node_probe_client.py) and prints ONE JSON object on stdout (node/lines.py); it never needs
the project installed on the node. Every part that can fail is caught and reported in the JSON ("error" fields), so a
broken piece of a node never hides the rest. `import torch` happens at most once per run, in a forked child started
first (aside()), so that it runs beside the other checks and a slow one is reported as such (--within).

The parsing functions (os_kind, wsl_networking, ...) are plain functions of their inputs so the
unit tests can feed them faked /proc contents; this module is also imported locally
(route_to, interface_addresses) so there is one copy of that logic.

Arguments:
  --route-to HOST      the peer whose route matters (workers: the master; master: a worker)
  --workdir DIR        the project's directory on the node (git commit, dirty tree)
  --data-dir DIR       the node's data directory (free disk, each data set's meta.json checksum)
  --tcp-rtt HOST:PORT  time TCP connects to this peer (RTT and loss from this node), in a child
                       process while the rest of the probe runs
  --samples N          how many connects for --tcp-rtt (default 5)
  --no-torch           skip torch (a cheap probe)
  --within S           answer within S seconds of the start: torch's import (in a child process from the start,
                       beside the other checks) that is still running then is reported as still importing
  --oom-kills cgroup|machine   only the OOM killer's count: this process's memory cgroup's, or the machine's
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import ipaddress
import json
import os
import platform
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from node.cgroups import cgroup_memory, cpu_usable, oom_kills, read
from node.lines import say

PROBE_VERSION = 1
SIOCGIFADDR = 0x8915
DNS_HANG_S = 1.5  # a reverse lookup still waiting after this long is waiting on a dead nameserver


# ---------------------------------------------------------------- parsing (unit-tested with fakes)

def os_kind(system: str, proc_version: str = "", osrelease: str = "", wsl_interop: bool = False) -> str:
    """linux / wsl1 / wsl2 / windows / macos / other, from platform.system() and /proc contents."""
    s = system.lower()
    if s == "windows" or s.startswith(("cygwin", "msys", "mingw")):
        return "windows"
    if s == "darwin":
        return "macos"
    if s != "linux":
        return s or "other"
    rel, ver = osrelease.lower(), proc_version.lower()
    if "microsoft" in rel or "microsoft" in ver or "wsl" in rel or wsl_interop:
        # WSL2 runs a real kernel built by Microsoft ("...-microsoft-standard-WSL2");
        # WSL1 has no Linux kernel and reports e.g. "4.4.0-19041-Microsoft" (capital M).
        if "wsl2" in rel or "microsoft-standard" in rel or "microsoft-standard" in ver:
            return "wsl2"
        if "Microsoft" in osrelease or "Microsoft" in proc_version:
            return "wsl1"
        return "wsl2"
    return "linux"


def wsl_networking(wslinfo_output: str | None, resolv_conf: str, interfaces: dict[str, list[str]]) -> str:
    """WSL2's networking mode: "mirrored", "nat" or "unknown".

    `wslinfo --networking-mode` says it directly on recent WSL. Otherwise: mirrored mode with DNS
    tunneling points resolv.conf at 10.255.255.254 and mirrors Windows' loopback as loopback0;
    NAT mode gives eth0 an address in 172.16.0.0/12 behind the Windows host.
    """
    if wslinfo_output:
        word = wslinfo_output.strip().lower()
        if word in ("mirrored", "nat", "virtioproxy", "none", "bridged"):
            return word
    for line in resolv_conf.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and parts[1] == "10.255.255.254":
            return "mirrored"
    if "loopback0" in interfaces:
        return "mirrored"
    nat_net = ipaddress.ip_network("172.16.0.0/12")
    for addr in interfaces.get("eth0", []):
        try:
            if ipaddress.ip_address(addr) in nat_net:
                return "nat"
        except ValueError:
            continue
    return "unknown"


def parse_ip_addr(text: str) -> dict[str, list[str]]:
    """`ip -o addr show` output -> {ifname: [addresses]} (IPv4 and IPv6, no prefix length)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("inet", "inet6"):
            name = parts[1].split("@")[0]
            out.setdefault(name, []).append(parts[3].split("/")[0])
    return out


def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- network facts

def interface_addresses() -> dict[str, list[str]]:
    """{ifname: [addresses]}: from `ip -o addr` when there, else one IPv4 per interface by ioctl."""
    if shutil.which("ip"):
        try:
            res = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=5)
            if res.returncode == 0 and res.stdout.strip():
                return parse_ip_addr(res.stdout)
        except (OSError, subprocess.SubprocessError):
            pass
    out: dict[str, list[str]] = {}
    try:
        names = socket.if_nameindex()
    except (OSError, AttributeError):
        return out
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in names:
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                out.setdefault(name, []).append(socket.inet_ntoa(raw[20:24]))
            except OSError:
                out.setdefault(name, [])
    return out


def resolve(host: str) -> list[str]:
    """Addresses `host` resolves to on this machine, IPv4 first, in resolver order."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []
    seen: list[str] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for fam, _, _, _, sa in infos:
            if fam == family and sa[0] not in seen:
                seen.append(sa[0])
    return seen


def route_to(host: str, interfaces: dict[str, list[str]] | None = None) -> dict:
    """The interface and source address this machine uses to reach `host` (no packet is sent).

    A UDP connect() asks the kernel's routing table. When the target is one of our own addresses
    the kernel says "lo"; the interface that holds that address is the one peers reach, so it is
    reported instead (that is what GLOO_SOCKET_IFNAME must name on the master).
    """
    out = {"target": host, "target_ip": None, "ifname": None, "src": None, "error": None}
    addrs = resolve(host)
    if not addrs:
        out["error"] = f"{host} does not resolve on this node"
        return out
    ip = addrs[0]
    out["target_ip"] = ip
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            src = s.getsockname()[0]
    except OSError as exc:
        out["error"] = f"no route to {host} ({ip}): {exc.strerror or exc}"
        return out
    out["src"] = src
    interfaces = interface_addresses() if interfaces is None else interfaces
    holders = [name for name, al in interfaces.items() if src in al]
    non_lo = [n for n in holders if n != "lo" and not n.startswith("lo:")]
    out["ifname"] = (non_lo or holders or [None])[0]
    return out


def tcp_rtt(host: str, port: int, samples: int = 5, timeout: float = 2.0) -> dict:
    """RTT by timing TCP connects (a SYN-ACK or a RST both measure it); a timeout counts as lost.

    A connect that needed a SYN retransmission (over 1 s) is counted as a lost packet too.
    """
    times: list[float] = []
    lost = 0
    ips = resolve(host)
    if not ips:
        return {"target": f"{host}:{port}", "method": "tcp", "error": f"{host} does not resolve", "sent": 0}
    for i in range(samples):
        t0 = time.perf_counter()
        try:
            with socket.create_connection((ips[0], port), timeout=timeout):
                pass
            ok = True
        except ConnectionRefusedError:
            ok = True
        except OSError:
            ok = False
        dt = time.perf_counter() - t0
        if ok and dt < 1.0:
            times.append(dt * 1000)
        else:
            lost += 1
        if i + 1 < samples:
            time.sleep(0.02)
    return rtt_summary(f"{host}:{port}", "tcp", times, samples)


def aside(fn, *args):
    """Run fn(*args) in a forked child, which hands its JSON-able answer back through a pipe, so that this
    process's own work cannot slow it nor it this process's (importing torch holds the GIL for long stretches:
    a thread's TCP connects measured a 0.1 ms link as 35 ms on average). Call this before starting any thread
    (nodes are Linux or WSL: os.fork is there; without it, a thread runs fn). Returns a function
    wait(timeout) -> (answer, why): the answer, or None and why not ("timed out after N s": the child is
    killed; "exited with code N", "killed by signal NAME"); timeout None waits as long as it takes."""
    if not hasattr(os, "fork"):
        return _aside_thread(fn, *args)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            data = json.dumps(fn(*args)).encode()
            while data:
                data = data[os.write(w, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)

    def wait(timeout: float | None) -> tuple[dict | None, str | None]:
        import select
        data, late = b"", False
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and (left <= 0 or not select.select([r], [], [], left)[0]):
                    os.kill(pid, signal.SIGKILL)
                    data, late = b"", True
                    break
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(r)
            status = os.waitpid(pid, 0)[1]
        if late:
            return None, f"timed out after {timeout:.1f} s"
        try:
            return json.loads(data), None
        except ValueError:
            return None, _ended(status)

    return wait


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        try:
            return f"killed by signal {signal.Signals(os.WTERMSIG(status)).name}"
        except ValueError:
            return f"killed by signal {os.WTERMSIG(status)}"
    return f"exited with code {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status} without an answer"


def _aside_thread(fn, *args):
    """aside() where there is no fork (native Windows): a daemon thread."""
    box: dict = {}

    def run() -> None:
        try:
            box["answer"] = fn(*args)
        except Exception as exc:
            box["why"] = f"{type(exc).__name__}: {exc}"

    th = threading.Thread(target=run, daemon=True)
    th.start()

    def wait(timeout: float | None) -> tuple[dict | None, str | None]:
        th.join(timeout)
        if th.is_alive():
            return None, f"timed out after {timeout:.1f} s"
        return box.get("answer"), box.get("why")

    return wait


def tcp_rtt_aside(host: str, port: int, samples: int):
    """tcp_rtt in a forked child (aside()): its timings are not lengthened by this process's import of torch.
    Returns a function wait(timeout) -> the tcp_rtt dict, or None if it did not finish in time."""
    wait = aside(tcp_rtt, host, port, samples)
    return lambda timeout: wait(timeout)[0]


def rtt_summary(target: str, method: str, times_ms: list[float], sent: int) -> dict:
    return {
        "target": target, "method": method, "sent": sent, "received": len(times_ms),
        "loss_pct": round(100.0 * (sent - len(times_ms)) / sent, 1) if sent else None,
        "min_ms": round(min(times_ms), 3) if times_ms else None,
        "avg_ms": round(sum(times_ms) / len(times_ms), 3) if times_ms else None,
        "max_ms": round(max(times_ms), 3) if times_ms else None,
        "error": None if times_ms else "no answer",
    }


# ---------------------------------------------------------------- node facts

def os_facts(interfaces: dict[str, list[str]]) -> dict:
    system = platform.system()
    osrelease = read("/proc/sys/kernel/osrelease").strip()
    kind = os_kind(system, read("/proc/version"), osrelease, os.path.exists("/proc/sys/fs/binfmt_misc/WSLInterop"))
    facts = {"system": system, "release": platform.release(), "kind": kind, "wsl_networking": None,
             "distro": None, "machine": platform.machine()}
    for line in read("/etc/os-release").splitlines():
        if line.startswith("PRETTY_NAME="):
            facts["distro"] = line.split("=", 1)[1].strip().strip('"')
    if system == "Darwin":
        facts["distro"] = "macOS " + platform.mac_ver()[0]
    if kind == "wsl2":
        out = None
        if shutil.which("wslinfo"):
            try:
                out = subprocess.run(["wslinfo", "--networking-mode"], capture_output=True, text=True,
                                     timeout=5).stdout
            except (OSError, subprocess.SubprocessError):
                out = None
        facts["wsl_networking"] = wsl_networking(out, read("/etc/resolv.conf"), interfaces)
    return facts


# ---------------------------------------------------------------- resources: psutil, or a stdlib fallback
#
# A node with hrmctl installed has psutil (a dependency of the project), and the facts come from it. The
# probe is also sent to nodes before anything is installed there, so each fact has a MINIMAL STANDARD-LIBRARY
# FALLBACK below (Linux /proc and /sys, os.getloadavg, statvfs); it gives the same keys, None where it
# cannot tell.

def _psutil():
    try:
        import psutil  # not at module level: the probe must import with the standard library alone
    except Exception:  # ImportError, or a broken install: the fallback answers
        return None
    return psutil


def _gb(n: float | None) -> float | None:
    return None if n is None else round(n / 2**30, 2)


def resource_facts() -> dict:
    """CPU count (logical and physical cores), memory (total and available) and the load average; with
    ``mem_cgroup_limit_gb`` and ``mem_cgroup_available_gb`` when the probe's memory cgroup has a limit (a
    container, a capped node), which the machine's own figures do not show; ``cpu_usable``: the CPUs this process
    may use (cpu_usable())."""
    out = _machine_resources()
    out["cpu_usable"] = cpu_usable()
    limit, free = cgroup_memory()
    if limit is not None:
        out["mem_cgroup_limit_gb"], out["mem_cgroup_available_gb"] = _gb(limit), _gb(free)
    return out


def _machine_resources() -> dict:
    ps = _psutil()
    if ps is not None:
        try:
            vm = ps.virtual_memory()
            try:
                load = [round(x, 2) for x in ps.getloadavg()]
            except (AttributeError, OSError):
                load = None
            return {"source": "psutil", "cpu_count": ps.cpu_count(logical=True),
                    "cpu_physical": ps.cpu_count(logical=False), "mem_total_gb": _gb(vm.total),
                    "mem_available_gb": _gb(vm.available), "load_avg": load}
        except Exception:
            pass  # a psutil that fails on this system: the fallback answers
    return _resource_facts_stdlib()


def _resource_facts_stdlib() -> dict:
    """MINIMAL STANDARD-LIBRARY FALLBACK (no psutil on the node): the same keys as resource_facts()."""
    total = avail = None
    for line in read("/proc/meminfo").splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("MemTotal:", "MemAvailable:"):
            value = int(parts[1]) * 1024
            total, avail = (value, avail) if parts[0] == "MemTotal:" else (total, value)
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = None
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        load = None
    return {"source": "stdlib", "cpu_count": os.cpu_count(), "cpu_physical": _physical_cores(),
            "mem_total_gb": _gb(total), "mem_available_gb": _gb(avail), "load_avg": load}


def _physical_cores() -> int | None:
    """Physical cores as psutil counts them on Linux: distinct core sibling lists in /sys, else distinct
    (physical id, core id) pairs in /proc/cpuinfo. Fallback only."""
    sib = (glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/core_cpus_list")
           or glob.glob("/sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list"))
    cores = {read(path).strip() for path in sib}
    if cores:
        return len(cores)
    pairs, phys = set(), None
    for line in read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            phys = value
        elif key == "core id":
            pairs.add((phys, value))
    return len(pairs) or None


def free_disk_gb(path: str) -> float | None:
    ps = _psutil()
    if ps is not None:
        try:
            return _gb(ps.disk_usage(path).free)
        except Exception:
            pass
    try:  # fallback: what psutil computes too (blocks free to unprivileged users)
        st = os.statvfs(path)
        return _gb(st.f_bavail * st.f_frsize)
    except (OSError, AttributeError):
        return None


DATA_MANIFEST = "meta.json"  # what `hrmctl prepare-data` (auralm.data.datadir) writes into every data directory


def data_sets(path: str) -> dict:
    """The prepared data sets in ``path`` (itself a data directory, or the root of several: ``path/*/``), each
    by its directory relative to ``path`` ("." for ``path`` itself) -> the sha256 of its manifest (which holds
    every file's size and sha256, so equal manifests mean equal data)."""
    out = {}
    for m in sorted(glob.glob(os.path.join(path, DATA_MANIFEST)) + glob.glob(os.path.join(path, "*", DATA_MANIFEST))):
        try:
            with open(m, "rb") as fh:
                out[os.path.relpath(os.path.dirname(m), path)] = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            continue
    return out


def disk_facts(data_dir: str | None) -> dict:
    """Free disk where data_dir is (or would be: its nearest existing parent) and the data sets in it."""
    if not data_dir:
        return {"path": None}
    path = os.path.expanduser(data_dir)
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe.rstrip("/")) or "/"
        if parent == probe:
            break
        probe = parent
    out = {"path": path, "exists": os.path.isdir(path), "free_gb": None, "manifest_sha256": None, "datasets": {}}
    out["free_gb"] = free_disk_gb(probe or "/")
    if out["exists"]:
        out["datasets"] = data_sets(path)
        if out["datasets"]:
            out["manifest_sha256"] = hashlib.sha256(json.dumps(out["datasets"], sort_keys=True).encode()).hexdigest()
    return out


def _git(workdir: str, *args: str) -> str | None:
    try:
        res = subprocess.run(["git", "-C", workdir, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def project_facts(workdir: str | None) -> dict:
    from importlib import metadata
    versions = {}
    # wandb, tensorboard: what logging.* asks of rank 0's node, checked before launch (cli/launch/preflight/prepare.py)
    for dist in ("torch", "transformers", "datasets", "tokenizers", "numpy", "paramiko", "hrmctl", "wandb", "tensorboard"):
        try:
            versions[dist] = metadata.version(dist)
        except Exception:
            versions[dist] = None
    out = {"workdir": None, "present": False, "launch_check": False, "commit": None, "dirty": None, "versions": versions,
           "installed": None}
    try:
        import importlib.util
        spec = importlib.util.find_spec("auralm")  # the trainer importable without workdir (installed)
        out["installed"] = os.path.dirname(spec.origin) if spec and spec.origin else None
    except (ImportError, ValueError):
        pass
    if not workdir:
        return out
    path = os.path.expanduser(workdir)
    out["workdir"] = path
    out["present"] = os.path.isdir(os.path.join(path, "auralm")) or os.path.isfile(os.path.join(path, "pyproject.toml"))
    # hrmctl's check of a first launch's guess (node/torchrun.py) is there: an older copy of the
    # project is launched with probed facts instead
    out["launch_check"] = os.path.isfile(os.path.join(path, "node", "torchrun.py"))
    if out["present"] and shutil.which("git"):
        head = _git(path, "rev-parse", "HEAD")
        if head:
            out["commit"] = head.strip()
            status = _git(path, "status", "--porcelain", "--untracked-files=no")
            out["dirty"] = None if status is None else bool(status.strip())
    if out["present"] and out["commit"] is None:  # placed by `hrmctl setup` (no .git): its stamp says the commit
        try:
            with open(os.path.join(path, ".hrmctl-setup.json")) as fh:
                stamp = json.load(fh)
            out["commit"], out["dirty"], out["placed_by"] = stamp.get("commit"), stamp.get("dirty"), "hrmctl setup"
        except (OSError, ValueError, AttributeError):
            pass
    return out


def hostname_facts() -> dict:
    name = socket.gethostname()
    addrs = resolve(name)
    return {"hostname": name, "hostname_addrs": addrs,
            # gloo binds the first address the hostname resolves to; loopback there breaks multi-node
            "hostname_loopback": bool(addrs) and is_loopback(addrs[0])}


def nameservers(resolv_conf: str) -> list[str]:
    return [l.split()[1] for l in resolv_conf.splitlines() if l.split()[:1] == ["nameserver"] and len(l.split()) > 1]


def dns_facts(box: dict) -> None:
    """Time a reverse lookup that /etc/hosts cannot answer (a v4-mapped loopback, as c10d's TCPStore
    does for its peers). When it waits on an unreachable nameserver, TCPStore stalls ~10 s."""
    t0 = time.perf_counter()
    try:
        socket.getnameinfo(("::ffff:127.0.0.1", 0, 0, 0), socket.NI_NAMEREQD)
    except (OSError, socket.gaierror):
        pass
    box["reverse_lookup_ms"] = round((time.perf_counter() - t0) * 1000, 1)


def gpu_driver() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = res.stdout.strip().splitlines()
    return lines[0].strip() if res.returncode == 0 and lines else None


def nvidia_gpu_count() -> int:
    """NVIDIA GPUs the driver shows, without torch: /proc/driver/nvidia/gpus on Linux, else
    `nvidia-smi -L` (WSL2 has no /proc/driver/nvidia). 0 when there is no driver."""
    try:
        return len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        pass
    smi = shutil.which("nvidia-smi") or ("/usr/lib/wsl/lib/nvidia-smi" if os.path.exists("/usr/lib/wsl/lib/nvidia-smi")
                                         else None)
    if not smi:
        return 0
    try:
        res = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in res.stdout.splitlines() if line.startswith("GPU ")) if res.returncode == 0 else 0


def torch_facts() -> dict:
    """torch, CUDA, NCCL, gloo and libuv, from ONE import of torch."""
    out = {"version": None, "error": None, "cuda_version": None, "cuda_devices": 0, "gpus": [],
           "driver": None, "nccl": False, "nccl_version": None, "gloo": False, "distributed": False,
           "libuv_ok": None, "libuv_error": None}
    try:
        import torch  # the one import; about 2.5 s on a small machine
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["version"] = str(torch.__version__)
    out["cuda_version"] = getattr(torch.version, "cuda", None)
    try:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        out["cuda_devices"] = n
        for i in range(n):
            p = torch.cuda.get_device_properties(i)
            out["gpus"].append({"index": i, "name": p.name, "memory_gb": round(p.total_memory / 2**30, 2),
                                "capability": f"{p.major}.{p.minor}"})
    except Exception as exc:
        out["cuda_error"] = f"{type(exc).__name__}: {exc}"
    if out["cuda_devices"]:
        out["driver"] = gpu_driver()
    try:
        import torch.distributed as dist
        out["distributed"] = bool(dist.is_available())
        if out["distributed"]:
            out["nccl"] = bool(dist.is_nccl_available())
            out["gloo"] = bool(dist.is_gloo_available())
            if out["nccl"]:
                try:
                    v = torch.cuda.nccl.version()
                    out["nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
                except Exception:
                    pass
            out["libuv_ok"], out["libuv_error"] = libuv_check(dist)
    except Exception as exc:
        out["distributed_error"] = f"{type(exc).__name__}: {exc}"
    return out


def torch_unfinished(waited_s: float, why: str) -> dict:
    """torch's facts when its import (aside, torch_facts) gave no answer in the probe's window: still importing
    (a cold or busy node: the first import reads about a gigabyte), or the import ended the process."""
    out = {"version": None, "cuda_devices": 0, "gpus": [], "nccl": False, "gloo": False, "distributed": False,
           "libuv_ok": None, "found": None}
    try:
        import importlib.util
        spec = importlib.util.find_spec("torch")  # where it is, without importing it
        out["found"] = os.path.dirname(spec.origin) if spec and spec.origin else None
    except (ImportError, ValueError):
        pass
    if why.startswith("timed out"):
        out.update(importing=True, waited_s=round(waited_s, 1), error=f"still importing torch after {waited_s:.0f} s")
    else:
        out["error"] = f"the import of torch ended its process ({why})"
    return out


def libuv_check(dist) -> tuple[bool, str | None]:
    """Does this torch's TCPStore really start with libuv? Tried on a free local port."""
    import datetime
    try:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=2), use_libuv=True)
    except TypeError:
        return False, "this torch's TCPStore has no use_libuv option"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    ok = bool(getattr(store, "libuvBackend", False))
    del store
    return ok, None if ok else "TCPStore started without libuv"


# ---------------------------------------------------------------- main

def collect(args: argparse.Namespace) -> dict:
    t0 = time.monotonic()
    # first, the two forks (a fork must not copy a process that runs threads); torch's import first of all: it is
    # the longest part (seconds; a minute on a cold laptop), and runs beside everything else
    torch_wait = None if args.no_torch else aside(torch_facts)
    rtt_wait = None
    if args.tcp_rtt:
        host, _, port = args.tcp_rtt.rpartition(":")
        rtt_wait = tcp_rtt_aside(host, int(port), args.samples)
    dns_box: dict = {}
    dns_thread = threading.Thread(target=dns_facts, args=(dns_box,), daemon=True)
    dns_thread.start()
    interfaces = interface_addresses()
    doc: dict = {"probe_version": PROBE_VERSION}
    doc.update(hostname_facts())
    doc["os"] = os_facts(interfaces)
    doc["python"] = {"version": platform.python_version(), "executable": sys.executable,
                     "implementation": platform.python_implementation()}
    doc["resources"] = resource_facts()
    doc["nvidia_gpus"] = nvidia_gpu_count() if args.no_torch else None  # with torch, torch counts them
    doc["interfaces"] = interfaces
    doc["route"] = route_to(args.route_to, interfaces) if args.route_to else None
    doc["data"] = disk_facts(args.data_dir)
    doc["project"] = project_facts(args.workdir)
    doc["torch"] = None if torch_wait is None else _torch_answer(torch_wait, t0, args.within)
    dns_thread.join(max(0.0, DNS_HANG_S - (time.monotonic() - t0)))
    doc["dns"] = {"nameservers": nameservers(read("/etc/resolv.conf")),
                  "reverse_lookup_ms": dns_box.get("reverse_lookup_ms"), "hang": not dns_box}
    if rtt_wait is not None:
        left = args.samples * 2.5 + 1 - (time.monotonic() - t0)
        doc["peer_rtt"] = rtt_wait(max(left, 0.5)) or {"target": args.tcp_rtt, "method": "tcp", "error": "timed out"}
    doc["seconds"] = round(time.monotonic() - t0, 3)
    return doc


def _torch_answer(wait, t0: float, within: float | None) -> dict:
    """torch's facts from its import aside, waited for until `within` s after the probe's start (None: as long as
    it takes)."""
    left = None if within is None else max(0.1, within - (time.monotonic() - t0))
    answer, why = wait(left)
    return answer if answer is not None else torch_unfinished(time.monotonic() - t0, why or "no answer")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hrmctl-probe")
    p.add_argument("--route-to")
    p.add_argument("--workdir")
    p.add_argument("--data-dir")
    p.add_argument("--tcp-rtt")
    p.add_argument("--samples", type=int, default=5)
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--within", type=float, help="answer within this many seconds of the start; torch, if its "
                   "import is still running then, is reported as still importing")
    p.add_argument("--oom-kills", choices=("cgroup", "machine"),
                   help="only the OOM killer's count (oom_kills): {\"oom_kills\": [where, count] or null}")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        doc = ({"oom_kills": oom_kills(machine=args.oom_kills == "machine")} if args.oom_kills else collect(args))
    except Exception as exc:  # a surprise still answers with JSON
        doc = {"probe_version": PROBE_VERSION, "fatal": f"{type(exc).__name__}: {exc}"}
    say(doc)
    return 0  # node.end: the answer is out; no teardown of torch (about 1 s on a small machine)
