"""How `hrmctl sync-data` shows its result: a line per node, the dry-run lists, or JSON."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from cli.sync.run import SyncReport

if TYPE_CHECKING:
    from rich.console import Console

LISTED = 40  # dry-run lines shown per node before "... and N more"


def show_report(report: SyncReport, *, as_json: bool, console: "Console", err: "Console") -> int:
    """Print the report; the exit code: 0 when every node is in sync, else the worst node's code."""
    if as_json:
        text = json.dumps(report.as_dict(), indent=2)
        if sys.stdout.isatty():
            console.print_json(text)
        else:  # for scripts, straight to stdout: rich (imported, and highlighting 10,000 paths) is 0.3 s
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
    else:
        for rel, why in report.skipped if any(n.ok for n in report.nodes) else ():
            err.print(f"[yellow]skipped[/yellow] {rel}: {why}", highlight=False, soft_wrap=True)
        dry = any(n.dry_run for n in report.nodes)
        if dry:
            _show_dry_run(report, console)
        else:
            _show_lines(report, console)
    codes = [n.exit_code or 1 for n in report.nodes if not n.ok]
    for n in report.nodes:  # on stderr with --json too: the JSON has them in "error"
        if not n.ok:
            err.print(f"error: {n.error}", markup=False, highlight=False, soft_wrap=True)
    return max(codes) if codes else 0


def _show_lines(report: SyncReport, console: "Console") -> None:
    """One line per node (readable at any terminal width)."""
    from rich.filesize import decimal
    from rich.markup import escape

    for n in report.nodes:
        status = "[green]in sync[/green]" if n.ok else "[red]failed[/red]"
        rate = f" at {decimal(int(n.rate))}/s" if n.sent_bytes else ""
        extra = "".join([f", resumed {decimal(n.resumed_bytes)}" if n.resumed_bytes else "",
                         f", re-sent {n.resent_files} after a checksum mismatch" if n.resent_files else "",
                         f", deleted {len(n.deleted)}" if n.deleted else ""])
        console.print(f"[bold]{n.node}[/bold] {escape(n.dest)}: {status} - {n.files} files, {n.unchanged} unchanged, "
                      f"sent {n.sent_files} ({decimal(n.sent_bytes)}){rate}{extra} in {n.seconds:.1f}s",
                      highlight=False, soft_wrap=True)


def _show_dry_run(report: SyncReport, console: "Console") -> None:
    from rich.markup import escape

    for n in report.nodes:
        if not n.ok:
            continue
        console.print(f"[bold]{n.node}[/bold] {escape(n.dest)}: {len(n.to_send)} to send, {len(n.to_delete)} to delete, "
                      f"{n.unchanged} unchanged (dry run: nothing was changed)", highlight=False)
        lines = [f"  send    {rel}" for rel in n.to_send] + [f"  delete  {rel}" for rel in n.to_delete]
        for line in lines[:LISTED]:
            console.print(line, markup=False, highlight=False)
        if len(lines) > LISTED:
            console.print(f"  ... and {len(lines) - LISTED} more (--json lists them all)", highlight=False)
