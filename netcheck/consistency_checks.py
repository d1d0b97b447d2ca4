"""Consistency across nodes: torch major.minor, the project's commit, the dataset manifest, and
the backend the world would get."""

from __future__ import annotations

from typing import Any

from .backend import choose_backend
from .node_checks import FAIL, OK, SKIP, WARN, Check


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
    importing = [n for n, p in probes.items() if getattr(p, "torch_importing_s", None) is not None]
    still = f"torch still importing on {', '.join(importing)}"
    out = [
        _agree("torch versions", torch_mm, differ=FAIL, label="torch", prefix="torch ",
               none=still if importing else "no node has torch",
               fix="`hrmctl setup` (from the machine whose packages every node should have) installs its torch "
                   "version on every node (collectives differ between versions)"),
        _agree("project commit", commits, differ=WARN, label="commits", short=10, none="no git checkout found",
               fix="`hrmctl setup` (from the checkout every node should run) brings every node to its commit"),
    ]
    out.append(dataset_check({n: (p.raw.get("data") or {}).get("datasets") or {} for n, p in probes.items()}))
    if probes and all(p.torch_version for p in probes.values()):
        backend, why = choose_backend(probes)
        out.append(Check("backend", OK, f"{backend}: {why}"))
    else:
        out.append(Check("backend", SKIP, still if importing else "not every node has torch"))
    return out


def dataset_check(held: dict[str, dict[str, str]]) -> Check:
    """held: node -> {data set (its directory under data_dir) -> sha256 of its meta.json}, the master first.
    fail when a data set differs between nodes, warn when a node lacks one another node has."""
    names = sorted({d for sets in held.values() for d in sets})
    if not names:
        return Check("dataset", SKIP, "no prepared data (meta.json) in any node's data_dir")
    master = next(iter(held))
    differ, missing = [], {}
    for d in names:
        groups = _groups({n: sets.get(d) for n, sets in held.items()})
        if len(groups) > 1:
            differ.append(f"{d}: {_describe(groups, short=12)}")
        for n, sets in held.items():
            if d not in sets:
                missing.setdefault(n, []).append(d)
    behind = [n for n, sets in held.items() if n != master and any(sets.get(d) != held[master].get(d) for d in names)]
    fix = (f"bring {', '.join(behind)} to match {master}: " + "; ".join(f"`hrmctl sync-data {n}`" for n in behind)
           if behind else f"bring {master}'s data to match: prepare it there, or sync from the node that has it")
    if differ:
        return Check("dataset", FAIL, "different prepared data: " + "; ".join(differ), fix)
    if missing:
        return Check("dataset", WARN, "prepared data missing: " + "; ".join(
            f"{', '.join(ds)} on {n}" for n, ds in missing.items()), fix)
    return Check("dataset", OK, f"{', '.join(names)}: the same meta.json everywhere")
