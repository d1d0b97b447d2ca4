"""Consistency across nodes: torch major.minor, the project's commit, the dataset manifest, and
the backend the world would get."""

from __future__ import annotations

from typing import Any

from .backend import choose_backend
from .checks import FAIL, OK, SKIP, WARN, Check


def _groups(values: dict[str, str | None]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, v in values.items():
        if v is not None:
            out.setdefault(v, []).append(name)
    return out


def _describe(groups: dict[str, list[str]], short: int = 0) -> str:
    return "; ".join(f"{(v[:short] if short else v)} on {', '.join(ns)}" for v, ns in groups.items())


def _agree(name: str, values: dict[str, str | None], *, differ: str, label: str, fix: str, none: str,
           short: int = 0, prefix: str = "") -> Check:
    """ok when every node that has a value has the same one; `differ` status otherwise."""
    g = _groups(values)
    if len(g) > 1:
        return Check(name, differ, f"different {label}: " + _describe(g, short), fix)
    if not g:
        return Check(name, SKIP, none)
    v = next(iter(g))
    return Check(name, OK, f"{prefix}{v[:short] if short else v} everywhere")


def cluster_checks(probes: dict[str, Any]) -> list[Check]:
    """probes: node name -> NodeProbe, for the nodes that answered."""
    torch_mm = {n: ".".join(p.torch_version.split("+")[0].split(".")[:2]) if p.torch_version else None
                for n, p in probes.items()}
    commits = {n: (p.raw.get("project") or {}).get("commit") for n, p in probes.items()}
    manifests = {n: (p.raw.get("data") or {}).get("manifest_sha256") for n, p in probes.items()}
    out = [
        _agree("torch versions", torch_mm, differ=FAIL, label="torch", prefix="torch ", none="no node has torch",
               fix="install the same torch major.minor on every node (collectives differ between versions)"),
        _agree("project commit", commits, differ=WARN, label="commits", short=10, none="no git checkout found",
               fix="check out the same commit on every node (`git -C <workdir> checkout <commit>`)"),
    ]
    data = _agree("dataset", manifests, differ=FAIL, label="prepared data", short=12, prefix="manifest ",
                  none="no prepared data (manifest.json) on any node",
                  fix="bring every node's data to match the master's: `hrmctl sync-data <node>`")
    missing = [n for n, v in manifests.items() if v is None]
    if data.status == OK and missing:
        data = Check("dataset", WARN, f"prepared data missing on {', '.join(missing)}",
                     f"copy it there: `hrmctl sync-data {missing[0]}`")
    out.append(data)
    if probes and all(p.torch_version for p in probes.values()):
        backend, why = choose_backend(probes)
        out.append(Check("backend", OK, f"{backend}: {why}"))
    else:
        out.append(Check("backend", SKIP, "not every node has torch"))
    return out
