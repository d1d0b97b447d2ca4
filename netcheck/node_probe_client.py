"""Run the node probe (node/probe.py, sent with the rest of node/ by node.ship.program) through a Session-like
object and read its answer as a NodeProbe.

A Session-like object has `.node` (with `.name`, `.python`, `.workdir`, `.data_path`) and
`.run_python(code, args, timeout=)` returning something with `.code`, `.stdout`, `.stderr`
(cli.nodes.remote.Session is one). Nothing here imports cli.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from node.ship import program


class ProbeError(Exception):
    """The probe could not run on a node, timed out, or answered garbage. str() is one line."""


def probe_args(*, route_to: str | None = None, workdir: str | None = None, data_dir: str | None = None,
               tcp_rtt: str | None = None, samples: int = 5, with_torch: bool = True,
               within: float | None = None) -> list[str]:
    args: list[str] = []
    for flag, value in (("--route-to", route_to), ("--workdir", workdir), ("--data-dir", data_dir),
                        ("--tcp-rtt", tcp_rtt)):
        if value:
            args += [flag, str(value)]
    if tcp_rtt:
        args += ["--samples", str(samples)]
    if not with_torch:
        args.append("--no-torch")
    elif within is not None:
        args += ["--within", f"{within:g}"]
    return args


def probe_window(timeout: float) -> float:
    """The seconds the probe may take to answer (its --within) when the session stops it after `timeout`: the rest,
    a tenth of it (at least 2 s, at most 10 s; never over half), is for the SSH exec, the interpreter's start and the
    answer's way back. A torch still importing then is reported as such, not lost with the whole answer."""
    return max(timeout - min(10.0, max(2.0, timeout / 10)), timeout / 2)


@dataclass
class NodeProbe:
    """One node's probe answer. The fields the launcher needs, plus everything in `raw`."""

    name: str
    hostname: str | None
    os_kind: str | None
    wsl_networking: str | None
    python_version: str | None
    torch_version: str | None
    torch_error: str | None
    cuda_devices: int
    nccl: bool
    gloo: bool
    libuv_ok: bool | None
    route_ifname: str | None
    route_src: str | None
    route_error: str | None
    hostname_loopback: bool
    gpus: list[dict] = field(default_factory=list)
    cpu_count: int | None = None
    cpu_usable: int | None = None            # of those, what the probe's process may use (affinity, CPU quota)
    ram_gb: float | None = None
    mem_available_gb: float | None = None
    load_avg: list[float] | None = None       # 1, 5 and 15 minutes
    torch_importing_s: float | None = None    # torch was still importing when the probe answered, after this long
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def nccl_usable(self) -> bool:
        """NCCL built in and at least one CUDA device: this node could run the NCCL backend."""
        return bool(self.nccl and self.cuda_devices > 0)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "raw"}
        d["nccl_usable"] = self.nccl_usable
        return d


def parse_probe(name: str, stdout: str) -> NodeProbe:
    """The probe's JSON line -> NodeProbe; ProbeError on anything else."""
    line = next((l for l in reversed(stdout.strip().splitlines()) if l.startswith("{")), None)
    if line is None:
        raise ProbeError(f"{name}: the probe printed no JSON ({_short(stdout) or 'no output'})")
    try:
        doc = json.loads(line)
    except ValueError:
        raise ProbeError(f"{name}: the probe answered garbage ({_short(line)})") from None
    if not isinstance(doc, dict) or "probe_version" not in doc:
        raise ProbeError(f"{name}: the probe answered garbage ({_short(line)})")
    if doc.get("fatal"):
        raise ProbeError(f"{name}: the probe failed on the node: {doc['fatal']}")
    try:
        torch = doc.get("torch") or {}
        route = doc.get("route") or {}
        osf = doc.get("os") or {}
        res = doc.get("resources") or {}
        return NodeProbe(
            name=name, hostname=doc.get("hostname"), os_kind=osf.get("kind"),
            wsl_networking=osf.get("wsl_networking"),
            python_version=(doc.get("python") or {}).get("version"),
            torch_version=torch.get("version"), torch_error=torch.get("error") if torch else "not probed",
            cuda_devices=int(torch.get("cuda_devices") or 0), nccl=bool(torch.get("nccl")),
            gloo=bool(torch.get("gloo")), libuv_ok=torch.get("libuv_ok"),
            route_ifname=route.get("ifname"), route_src=route.get("src"), route_error=route.get("error"),
            hostname_loopback=bool(doc.get("hostname_loopback")), gpus=list(torch.get("gpus") or []),
            cpu_count=res.get("cpu_count"), cpu_usable=res.get("cpu_usable"), ram_gb=res.get("mem_total_gb"),
            mem_available_gb=res.get("mem_available_gb"), load_avg=res.get("load_avg"),
            torch_importing_s=torch.get("waited_s") if torch.get("importing") else None, raw=doc,
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise ProbeError(f"{name}: the probe's answer is malformed ({exc})") from None


def run_probe(session: Any, *, route_to: str | None, timeout: float = 60, tcp_rtt: str | None = None,
              with_torch: bool = True, within: float | None = None) -> NodeProbe:
    """Run the probe on the session's node. Raises ProbeError (one line, naming the node). `within`: the probe
    answers by then (probe_window(timeout)), with torch as still importing if it is; None: the session's timeout
    stops a probe that has not answered, and the answer is lost."""
    node = session.node
    args = probe_args(route_to=route_to, workdir=node.workdir, data_dir=node.data_path, tcp_rtt=tcp_rtt,
                      with_torch=with_torch, within=within)
    try:
        res = session.run_python(program("probe"), args, timeout=timeout)
    except Exception as exc:  # the session's own errors (timeout, lost connection) are one line already
        raise ProbeError(str(exc) if node.name in str(exc) else f"{node.name}: {exc}") from None
    if res.code == 127 or (res.code != 0 and "No such file" in res.stderr and not res.stdout):
        raise ProbeError(f"{node.name}: python '{node.python}' not found on the node; install Python 3 "
                         f"or set python = \"/path/to/python3\" for {node.name} in the inventory")
    if res.code != 0 and not res.stdout.strip():
        last = (res.stderr.strip().splitlines() or [f"exit code {res.code}"])[-1]
        raise ProbeError(f"{node.name}: the probe did not run with {node.python}: {_short(last)}; "
                         "the node needs Python >= 3.8")
    return parse_probe(node.name, res.stdout)


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
