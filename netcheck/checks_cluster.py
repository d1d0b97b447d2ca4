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


def cluster_checks(probes: dict[str, Any]) -> list[Check]:
    """probes: node name -> NodeProbe, for the nodes that answered."""
    out = []
    torch_mm = {n: ".".join(p.torch_version.split("+")[0].split(".")[:2]) if p.torch_version else None
                for n, p in probes.items()}
    g = _groups(torch_mm)
    if not g:
        out.append(Check("torch versions", SKIP, "no node has torch"))
    elif len(g) > 1:
        out.append(Check("torch versions", FAIL, "different torch: " + _describe(g),
                         "install the same torch major.minor on every node (collectives differ between versions)"))
    else:
        out.append(Check("torch versions", OK, f"torch {next(iter(g))} everywhere"))
    commits = {n: (p.raw.get("project") or {}).get("commit") for n, p in probes.items()}
    g = _groups(commits)
    if len(g) > 1:
        out.append(Check("project commit", WARN, "different commits: " + _describe(g, 10),
                         "check out the same commit on every node (`git -C <workdir> checkout <commit>`)"))
    elif g:
        out.append(Check("project commit", OK, f"{next(iter(g))[:10]} everywhere"))
    else:
        out.append(Check("project commit", SKIP, "no git checkout found"))
    manifests = {n: (p.raw.get("data") or {}).get("manifest_sha256") for n, p in probes.items()}
    g = _groups(manifests)
    if len(g) > 1:
        out.append(Check("dataset", FAIL, "different prepared data: " + _describe(g, 12),
                         "bring every node's data to match the master's: `hrmctl sync-data <node>`"))
    elif g:
        missing = [n for n, v in manifests.items() if v is None]
        if missing:
            out.append(Check("dataset", WARN, f"prepared data missing on {', '.join(missing)}",
                             f"copy it there: `hrmctl sync-data {missing[0]}`"))
        else:
            out.append(Check("dataset", OK, f"manifest {next(iter(g))[:12]} everywhere"))
    else:
        out.append(Check("dataset", SKIP, "no prepared data (manifest.json) on any node"))
    if probes and all(p.torch_version for p in probes.values()):
        backend, why = choose_backend(probes)
        out.append(Check("backend", OK, f"{backend}: {why}"))
    else:
        out.append(Check("backend", SKIP, "not every node has torch"))
    return out
