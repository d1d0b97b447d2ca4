"""`hrmctl nodes`: the resolved inventory, and optionally a live check of every node."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cli.nodes.inventory import Inventory, Node
from cli.nodes.remote import Session, for_each
from node.lines import last
from node.ship import program

SHOWN = ("host", "user", "port", "python", "workdir", "data_dir", "nproc", "threads", "ifname", "identity_file", "known_hosts")

# Run on each node by --check: who and where we are; then the node's Python, asked through the node agent (its
# probe without torch: node/probe.py, whose answer says the Python's version).
CHECK_ARGV = ["sh", "-c", 'echo "$(uname -n) $(uname -s)"']


def _check(session: Session) -> dict:
    res = session.run(CHECK_ARGV, timeout=15)
    py = session.run_python(program("probe"), ["--no-torch"], timeout=15)
    version = ((last(py.stdout) or {}).get("python") or {}).get("version") if py.ok else None
    return {
        "hostname": res.stdout.split()[0] if res.ok and res.stdout.split() else None,
        "python_version": version,
        "python_error": None if version else py.last_line(),
    }


def _value(node: Node, key: str) -> str:
    """The value as table text: an inventory's `[` is shown as written, never read as rich markup."""
    v = getattr(node, key)
    if isinstance(v, list):
        return escape(", ".join(v)) or "-"
    return "-" if v is None else escape(str(v))


def show_nodes(inv: Inventory, nodes: list[Node], *, check: bool, accept_new_host_keys: bool,
               as_json: bool, console: Console) -> int:
    """Print the nodes; with check, connect to each. Exit code 1 if any check failed."""
    results = {}
    if check:
        for o in for_each(nodes, _check, accept_new_host_keys=accept_new_host_keys):
            if o.ok and o.value["python_error"]:
                o.error = f"{o.node.name}: python {o.node.python} does not run: {o.value['python_error']}"
            results[o.node.name] = o
    failed = any(not o.ok for o in results.values())
    master = nodes[0].name if nodes else None
    if as_json:
        doc = {
            "inventory": str(inv.path) if inv.path else None,
            "master": master,
            "nodes": [],
        }
        for n in nodes:
            entry = n.as_dict()
            if check:
                o = results[n.name]
                entry["check"] = {"ok": o.ok, "error": o.error, "seconds": round(o.seconds, 3),
                                  **(o.value or {})}
            doc["nodes"].append(entry)
        console.print_json(json.dumps(doc))
        return 1 if failed else 0

    where = str(inv.path) if inv.path else "no inventory file (this machine only)"
    table = Table(title=escape(f"nodes — {where}"), title_justify="left")
    table.add_column("setting")
    for n in nodes:
        table.add_column(escape(n.name) + (" (master)" if n.name == master else ""))
    for key in SHOWN:
        table.add_row(key, *[f"{_value(n, key)} [dim]({n.sources.get(key, 'built-in')})[/dim]" for n in nodes])
    if check:
        row = []
        for n in nodes:
            o = results[n.name]
            row.append(f"[green]ok[/green] {o.value['hostname']} py{o.value['python_version']} {o.seconds:.2f}s"
                       if o.ok else "[red]fail[/red]")
        table.add_row("check", *row)
    console.print(table)
    for o in results.values():
        if not o.ok:
            console.print(f"[red]fail[/red] {escape(str(o.error))}", highlight=False, soft_wrap=True)
    return 1 if failed else 0
