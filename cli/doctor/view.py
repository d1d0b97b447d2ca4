"""Render a DoctorReport: a rich table (check × node) with the fixes under it, or JSON."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.doctor.run import ROWS, DoctorReport

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def report_json(rep: DoctorReport) -> dict:
    counts = rep.counts()
    return {
        "master": rep.master, "master_address": rep.master_address, "master_port": rep.master_port,
        "nodes": {r.node.name: r.as_dict() for r in rep.nodes},
        "cluster": {c.name: c.as_dict() for c in rep.cluster},
        "mesh": rep.mesh.as_dict() if rep.mesh else None,
        "problems": rep.problems,
        "summary": {**counts, "nodes": len(rep.nodes), "seconds": round(rep.seconds, 3)},
        "exit_code": rep.exit_code,
    }


def _cell(status: str, detail: str, width: int | None) -> str:
    text = f"{status} {detail}"
    if width is not None and len(text) > width:
        detail = detail[: max(0, width - len(status) - 2)] + "…"
    return f"[{STYLE[status]}]{status}[/] {escape(detail)}"


def cell_width(console_width: int, n_nodes: int) -> int:
    """Room per node column so the table fits the terminal (one line per cell)."""
    return max(10, (console_width - 14 - 3 * (n_nodes + 1)) // max(1, n_nodes))


def render(rep: DoctorReport, console: Console, *, verbose: bool = False) -> None:
    title = (f"doctor — master {rep.master} ({rep.master_address or 'address unknown'}), "
             f"master port {rep.master_port}")
    table = Table(title=title, title_justify="left", show_lines=False)
    table.add_column("check", style="bold", no_wrap=True)
    width = None if verbose else cell_width(console.width, len(rep.nodes))
    for r in rep.nodes:
        table.add_column(r.node.name + (" (master)" if r.is_master else ""), overflow="fold", no_wrap=not verbose)
    for row in ROWS:
        cells = []
        for r in rep.nodes:
            c = next((c for c in r.checks if c.name == row), None)
            cells.append(_cell(c.status, c.detail, width) if c else "")
        table.add_row(row, *cells)
    console.print(table)

    issues = [(r.node.name, c) for r in rep.nodes for c in r.checks if c.status in ("warn", "fail")]
    issues += [("cluster", c) for c in rep.cluster if c.status in ("warn", "fail")]
    issues.sort(key=lambda x: x[1].status != "fail")
    for where, c in issues:
        console.print(f"[{STYLE[c.status]}]{c.status}[/] {escape(where)} · {escape(c.name)}: {escape(c.detail)}",
                      soft_wrap=True, highlight=False)
        if c.fix:
            console.print(f"     fix: {escape(c.fix)}", soft_wrap=True, highlight=False)
    if rep.cluster:
        console.print()
        for c in rep.cluster:
            if c.status in ("ok", "skip"):
                console.print(f"[{STYLE[c.status]}]{c.status}[/] cluster · {escape(c.name)}: {escape(c.detail)}",
                              soft_wrap=True, highlight=False)
    if verbose:
        if rep.mesh:
            console.print(f"[dim]mesh, {escape(rep.mesh.rule)}:[/]", soft_wrap=True, highlight=False)
            for d in rep.mesh.directions:
                state = (f"[green]ok[/] {d['ms']:.1f} ms" if d["ok"] and d["ms"] is not None else
                         "[green]ok[/]" if d["ok"] else f"[{STYLE['fail' if d['needed'] else 'warn']}]blocked[/] "
                         f"({escape(d['error'] or '')})")
                need = "needed" if d["needed"] else f"not used by {rep.mesh.backend}"
                console.print(f"  {escape(d['from'])} -> {escape(d['to'])}: {state}, {need}", soft_wrap=True,
                              highlight=False)
        for r in rep.nodes:
            if r.probe:
                ifs = "; ".join(f"{k} {' '.join(v)}" for k, v in (r.probe.raw.get("interfaces") or {}).items())
                console.print(f"[dim]{escape(r.node.name)} interfaces: {escape(ifs)}[/]", soft_wrap=True)
    for p in rep.problems:
        console.print(f"[bold red]fail[/] {escape(p)}", soft_wrap=True, highlight=False)
    n = rep.counts()
    verdict = ("[green]ready to train[/]" if rep.exit_code == 0 else
               "[bold red]not ready: fix the failures above[/]")
    console.print(f"summary: {len(rep.nodes)} node(s), {n['ok']} ok, {n['warn']} warn, {n['fail']} fail, "
                  f"{n['skip']} skipped in {rep.seconds:.1f}s — {verdict}", highlight=False, soft_wrap=True)


def show(rep: DoctorReport, console: Console, *, as_json: bool, verbose: bool) -> int:
    if as_json:
        console.file.write(json.dumps(report_json(rep), indent=2, default=str) + "\n")
        console.file.flush()
    else:
        render(rep, console, verbose=verbose)
    return rep.exit_code
