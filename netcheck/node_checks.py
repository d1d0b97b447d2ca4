"""Turn probe answers into checks: ok / warn / fail (or skip), each warn and fail with a one-line fix.

Pure functions of their inputs (NodeProbe, rtt dicts, ClockSkew, PortCheck/MeshResult), so they
are unit-testable without nodes. Per-node facts here; network checks in network_checks.py; the
cluster-wide consistency in consistency_checks.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
MIN_FREE_GB = 2.0


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail, "fix": self.fix}


def os_check(p: Any, multi: bool) -> Check:
    kind = p.os_kind or "unknown"
    distro = (p.raw.get("os") or {}).get("distro") or (p.raw.get("os") or {}).get("system") or ""
    if kind == "windows":
        return Check("os", WARN, f"native Windows {distro}".strip(),
                     "torchrun on native Windows is unreliable (no NCCL, libuv trouble): run the node in WSL2 "
                     "(`wsl --install`) with networkingMode=mirrored")
    if kind == "wsl1":
        return Check("os", FAIL, "WSL1 (no Linux kernel networking for gloo/NCCL)",
                     "convert the distro to WSL2: `wsl --set-version <distro> 2` in PowerShell")
    if kind == "wsl2":
        mode = p.wsl_networking or "unknown"
        detail = f"WSL2 ({mode} networking) {distro}".strip()
        if mode == "nat" and multi:
            return Check("os", FAIL, detail + ": the LAN cannot reach the distro",
                         "in %UserProfile%\\.wslconfig set [wsl2] networkingMode=mirrored, run `wsl --shutdown`, and "
                         "allow inbound TCP in Windows Defender Firewall (Hyper-V firewall: "
                         "`Set-NetFirewallHyperVVMSetting -Name '{40E0AC32-46A5-438A-A0B2-2B479E8F2E90}' -DefaultInboundAction Allow`)")
        if mode != "mirrored" and multi:
            return Check("os", WARN, detail, "use networkingMode=mirrored in %UserProfile%\\.wslconfig so the LAN "
                         "reaches the distro, and allow the ports in Windows Defender Firewall")
        return Check("os", OK, detail)
    if kind == "macos":
        return Check("os", WARN, distro or "macOS", "macOS has no CUDA/NCCL: this node trains with gloo on CPU only "
                     "(MPS is not used by DDP); keep it out of NCCL worlds")
    return Check("os", OK, f"{distro or kind} ({(p.raw.get('os') or {}).get('machine', '')})".replace(" ()", ""))


def python_check(p: Any) -> Check:
    v = p.python_version or "?"
    try:
        major, minor = (int(x) for x in v.split(".")[:2])
    except ValueError:
        return Check("python", WARN, f"version {v!r}", "use CPython 3.10 or newer for the trainer")
    if (major, minor) < (3, 10):
        return Check("python", FAIL, f"{v}: the trainer needs 3.10+",
                     "install Python 3.10+ on the node and set python = \"/path/to/python3\" in the inventory")
    return Check("python", OK, v)


def longer_timeout(timeout: float | None) -> str:
    """The fix for a probe that ran out of its window: a longer `hrmctl doctor --timeout`."""
    longer = max(120, 2 * int(-(-timeout // 1))) if timeout else 120
    return f"rerun with --timeout {longer}; a cold laptop's first import of torch can take a minute"


def torch_check(p: Any, python: str, timeout: float | None = None) -> Check:
    """`timeout`: the --timeout the probe ran under (its fix when torch was still importing)."""
    if _importing(p):
        found = (p.raw.get("torch") or {}).get("found")
        window = f", the probe's window under --timeout {timeout:g}" if timeout else ""
        return Check("torch", FAIL, f"still importing torch after {p.torch_importing_s:.0f} s{window}"
                     + (f" ({found})" if found else ""), longer_timeout(timeout))
    if p.torch_version is None:
        why = p.torch_error or "not installed"
        return Check("torch", FAIL, f"no torch for {python} ({why.splitlines()[0][:80]})",
                     f"install it into that Python: `{python} -m pip install torch` (or point python = in the "
                     "inventory at the venv that has it)")
    cuda = (p.raw.get("torch") or {}).get("cuda_version")
    return Check("torch", OK, f"{p.torch_version}" + (f" CUDA {cuda}" if cuda else ""))


def _importing(p: Any) -> bool:
    return getattr(p, "torch_importing_s", None) is not None


def _no_torch(p: Any) -> str:
    return "torch still importing" if _importing(p) else "no torch"


def gpu_check(p: Any) -> Check:
    if p.torch_version is None:
        return Check("gpu", SKIP, _no_torch(p))
    t = p.raw.get("torch") or {}
    if t.get("cuda_error"):
        return Check("gpu", WARN, f"CUDA error: {t['cuda_error'][:80]}",
                     "check the NVIDIA driver (`nvidia-smi`) matches this torch's CUDA build")
    if not p.gpus:
        if t.get("cuda_version"):
            return Check("gpu", WARN, "CUDA torch but no usable GPU",
                         "check `nvidia-smi` on the node (driver loaded? on WSL2, the Windows NVIDIA driver)")
        return Check("gpu", OK, "none (CPU)")
    names = ", ".join(f"{g['name']} {g['memory_gb']:g} GB" for g in p.gpus)
    drv = t.get("driver")
    return Check("gpu", OK, f"{len(p.gpus)}× {names}" + (f", driver {drv}" if drv else ""))


def distributed_check(p: Any) -> Check:
    if p.torch_version is None:
        return Check("nccl/gloo", SKIP, _no_torch(p))
    t = p.raw.get("torch") or {}
    if not t.get("distributed"):
        return Check("nccl/gloo", FAIL, "torch.distributed is not available in this torch build",
                     "install a torch build with distributed support (the PyPI wheels have it)")
    have = []
    if p.nccl_usable:
        have.append("nccl" + (f" {t['nccl_version']}" if t.get("nccl_version") else ""))
    elif p.nccl:
        have.append("nccl (no CUDA device)")
    if p.gloo:
        have.append("gloo")
    if not p.gloo and not p.nccl_usable:
        return Check("nccl/gloo", FAIL, "neither gloo nor a usable NCCL",
                     "install the PyPI torch wheel, which has gloo (and NCCL on Linux CUDA builds)")
    return Check("nccl/gloo", OK, ", ".join(have))


def libuv_check(p: Any) -> Check:
    if p.torch_version is None or p.libuv_ok is None:
        return Check("libuv", SKIP, "torch still importing" if _importing(p) else "no torch.distributed")
    if p.libuv_ok:
        return Check("libuv", OK, "TCPStore runs on libuv")
    err = (p.raw.get("torch") or {}).get("libuv_error") or ""
    dns = p.raw.get("dns") or {}
    if dns.get("hang"):
        servers = ", ".join(dns.get("nameservers") or []) or "none"
        return Check("libuv", WARN, f"TCPStore stalls: reverse DNS lookups hang (nameserver {servers} does not answer)",
                     "make /etc/resolv.conf name a reachable DNS server (or none); until then `hrmctl train` sets "
                     "USE_LIBUV=0 on this node")
    return Check("libuv", WARN, f"TCPStore does not start with libuv ({err[:70]})",
                 "`hrmctl train` sets USE_LIBUV=0 (TORCH_DISTRIBUTED_USE_LIBUV=0) on this node; by hand, "
                 "export USE_LIBUV=0 before torchrun")


def interface_check(p: Any, inventory_ifname: str | None, multi: bool) -> Check:
    if p.route_error:
        return Check("interface", FAIL if multi else WARN, p.route_error,
                     "check the node's network (`ip route get <master address>`) and the master's host in the inventory")
    if not p.route_ifname:
        return Check("interface", SKIP, "no peer to route to")
    detail = f"{p.route_ifname} {p.route_src}"
    if inventory_ifname and inventory_ifname != p.route_ifname:
        return Check("interface", WARN, detail + f" (inventory says {inventory_ifname})",
                     f"the route to the master leaves through {p.route_ifname}; set ifname = \"{p.route_ifname}\" "
                     "in the inventory, or check that the master is reachable through the one named")
    if p.route_ifname == "lo" and multi:
        return Check("interface", FAIL, detail + ": the master looks like this node's loopback",
                     "give the master's LAN address as its host in the inventory, not localhost/127.x")
    return Check("interface", OK, detail)


def hostname_check(p: Any, multi: bool) -> Check:
    addrs = (p.raw.get("hostname_addrs") or [])[:3]
    detail = f"{p.hostname} -> {', '.join(addrs) or 'does not resolve'}"
    if p.hostname_loopback and multi:
        return Check("hostname", WARN, detail + ": gloo would bind loopback",
                     f"map {p.hostname} to the node's LAN address in /etc/hosts (replace the 127.0.1.1 line), or set "
                     f"GLOO_SOCKET_IFNAME={p.route_ifname or '<LAN interface>'} (hrmctl train does)")
    if not addrs:
        return Check("hostname", WARN, detail, f"add `{p.route_src or '<LAN IP>'} {p.hostname}` to /etc/hosts")
    return Check("hostname", OK, detail)


def resources_check(p: Any) -> Check:
    data = p.raw.get("data") or {}
    free = data.get("free_gb")
    avail = getattr(p, "mem_available_gb", None)
    load = getattr(p, "load_avg", None)
    detail = (f"{p.cpu_count} CPU" + (f", load {load[0]:g}" if load else "")
              + f", {p.ram_gb or '?'} GB RAM" + (f" ({avail:g} available)" if avail is not None else "")
              + (f", {free:g} GB free for data" if free is not None else ""))
    if free is not None and free < MIN_FREE_GB:
        return Check("resources", WARN, detail, f"free disk space where {data.get('path')} lives (under {MIN_FREE_GB:g} GB)")
    return Check("resources", OK, detail)


TRAINER_LIBS = ("transformers", "datasets")


def project_check(p: Any, workdir: str, python: str = "python3") -> Check:
    proj = p.raw.get("project") or {}
    if not proj.get("present") and proj.get("installed"):
        return Check("project", OK, f"installed ({proj['installed']}); {workdir} holds no checkout")
    if not proj.get("present"):
        return Check("project", FAIL, f"no project in {workdir}",
                     f"put the project there (`git clone <repo> {workdir}`, or set workdir = in the inventory)")
    commit = proj.get("commit")
    versions = proj.get("versions") or {}
    libs = ", ".join(f"{d} {versions[d]}" for d in TRAINER_LIBS if versions.get(d))
    head = f"{commit[:10]}" if commit else "present (not a git checkout)"
    missing = [d for d in TRAINER_LIBS if not versions.get(d)]
    if missing:
        return Check("project", WARN, f"{head}; {', '.join(missing)} not installed",
                     f"`hrmctl setup` installs this machine's packages there (or by hand: `{python} -m pip install "
                     f"{' '.join(missing)}`)")
    if proj.get("dirty") and proj.get("placed_by") == "hrmctl setup":
        return Check("project", WARN, f"{head} with uncommitted changes, sent by `hrmctl setup --allow-dirty` ({libs})",
                     "commit the changes where you ran hrmctl setup, then `hrmctl setup` again")
    if proj.get("dirty"):
        return Check("project", WARN, f"{head} with uncommitted changes ({libs})",
                     f"commit or discard the changes in {workdir} so every node runs the same code")
    return Check("project", OK, f"{head} ({libs})")


def node_checks(p: Any, node: Any, multi: bool, timeout: float | None = None) -> list[Check]:
    """The per-node checks from one NodeProbe; node: the inventory Node (python, workdir, ifname); timeout: the
    probe's --timeout."""
    return [os_check(p, multi), python_check(p), torch_check(p, node.python, timeout), gpu_check(p),
            distributed_check(p),
            libuv_check(p), interface_check(p, node.ifname, multi), hostname_check(p, multi), resources_check(p),
            project_check(p, node.workdir, node.python)]


NODE_CHECKS = ("os", "python", "torch", "gpu", "nccl/gloo", "libuv", "interface", "hostname", "resources", "project")
