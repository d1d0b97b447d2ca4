"""What `hrmctl setup` prints: per node what was (or, with --dry-run, would be) sent and installed, or JSON."""

from __future__ import annotations

import json

from cli.setup.run import NodeResult


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def node_lines(r: NodeResult, dry_run: bool) -> list[str]:
    if not r.ok and r.python is None:
        return [f"{r.node}: FAILED: {r.error}"]
    t = r.torch or {}
    would = "would " if dry_run else ""
    lines = [f"{r.node}: python {r.python}, venv {r.venv}",
             f"  code: commit {(r.commit or '?')[:10]}: {would}send {len(r.code_sent)} of {r.code_files} files"
             + (f", removed {len(r.code_removed)} of an older commit" if r.code_removed else ""),
             f"  torch: {t.get('requirement')} (index {t.get('index')}): {t.get('why')}",
             f"  venv: {r.venv_action} ({r.venv_why})"]
    if r.venv_action == "build":
        lines.append(f"  wheels: sent {r.wheels_sent} ({_mb(r.wheels_bytes)}); installed with "
                     f"`{' '.join(r.install_command)}`")
    elif r.venv_action == "would build":
        lines.append("  install: from the wheels this machine sends only (--no-index), into a new directory, "
                     "switched in when complete")
    if r.checks:
        bad = {k: c for k, c in r.checks.items() if c["status"] != "ok"}
        lines.append("  check: " + ("commit and packages match this machine" if not bad else
                                    "; ".join(f"{k} {c['detail']}" for k, c in bad.items())
                                    + " - fix: hrmctl setup"))
    if not r.ok:
        lines.append(f"  FAILED: {r.error}")
    elif not dry_run:
        lines.append(f"  ready in {r.seconds:.1f} s")
    return lines


def show(results: list[NodeResult], *, dry_run: bool, as_json: bool, console, err) -> int:
    code = exit_code(results)
    if as_json:
        print(json.dumps({"dry_run": dry_run, "ok": code == 0, "nodes": [r.as_dict() for r in results]}, indent=2))
        return code
    for r in results:
        for line in node_lines(r, dry_run):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    for r in results:
        if not r.ok:
            err.print(f"error: {r.error}", markup=False, highlight=False, soft_wrap=True)
    return code


def exit_code(results: list[NodeResult]) -> int:
    if all(r.ok for r in results):
        return 0
    if all(r.exit_code == 3 for r in results):
        return 3
    return 1 if any(r.exit_code != 2 for r in results if not r.ok) else 2
