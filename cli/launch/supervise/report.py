"""What the user reads of a launch (the supervise stage's last part). --dry-run's plan (each node's exact command line
and environment, the model's size, batch_size=auto's estimate) and the run's end (its last line, or the --json
document). test-ddp's table is ddp_report.py. May import: the earlier stages' types (options, plan, attempt).
"""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape

from cli.launch.plan.options import TRAINER
from cli.launch.plan.plan import LaunchPlan, redacted
from cli.launch.plan.timing import lines as time_lines
from cli.launch.run.attempt import RunResult, summary_line


def dry_run_text(prep: LaunchPlan) -> list[str]:
    """Per node: the exact command line (env included) that a real launch runs."""
    lines = [f"# run {prep.run_id}: {len(prep.plans)} node(s), world size "
             f"{sum(p.nproc for p in prep.plans)}, backend {prep.backend} ({prep.why})"]
    for p in prep.plans:
        lines.append(f"# {p.node.name} (node rank {p.node_rank}, ranks {p.ranks.start}-{p.ranks.stop - 1}"
                     f"{', ' + '; '.join(p.notes) if p.notes else ''})")
        lines.append(p.shell_line(redact=True))
    return lines


def dry_run_json(prep: LaunchPlan) -> dict:
    return {"run_id": prep.run_id, "backend": prep.backend, "why": prep.why,
            "nodes": [{"node": p.node.name, "host": p.node.host, "node_rank": p.node_rank, "nproc": p.nproc,
                       "ranks": list(p.ranks), "cwd": p.cwd, "argv": p.argv, "env": redacted(p.env),
                       "command": p.shell_line(redact=True)} for p in prep.plans]}


def dry_run(prep: LaunchPlan, size: dict | None, auto: dict | None, *, as_json: bool, console: Console,
            choice: str = "", link: dict | None = None, timing: dict | None = None) -> int:
    """--dry-run: each node's exact command and environment, the run's time (``timing``:
    cli.launch.plan.timing.summary), how the model was chosen, its size, and batch_size=auto's estimate per node
    (``auto``: cli.launch.command.auto_batch_plan); as text or one JSON document."""
    if as_json:
        console.print_json(json.dumps({**dry_run_json(prep), "model": size, **({"model_choice": choice} if choice else {}),
                                       **({"auto_batch": auto} if auto else {}), **({"time": timing} if timing else {}),
                                       **({"link": link} if prep.options.module == TRAINER else {})}))
        return 0
    for line in dry_run_text(prep) + time_lines(timing):
        console.print(escape(line), highlight=False, soft_wrap=True)
    gib = 1 << 30
    if choice:
        console.print(f"# model: {escape(choice)}", highlight=False, soft_wrap=True)
    if size and auto:
        console.print(f"# model {size['name']}: {size['parameters'] / 1e6:.2f}M parameters; per rank about "
                      f"{size['states_bytes'] / gib:.2f} GiB of weights, gradients and optimizer states, and "
                      f"{size['activation_bytes_per_row'] / 2**20:.1f} MiB of activations a row", highlight=False,
                      soft_wrap=True)
        for name, n in auto["nodes"].items():
            if n["fits"] is None:
                console.print(f"# {name}: batch_size=auto: its memory is unknown (the probe did not say); its ranks "
                              f"measure at start", highlight=False, soft_wrap=True)
                continue
            where = f"{n['memory_gb']:g} GiB GPU memory" if n["memory"] == "gpu" else \
                f"{n['memory_gb']:g} GiB RAM available" + (f" / {n['ranks']} ranks" if n["ranks"] > 1 else "")
            console.print(f"# {name}: batch_size=auto: about {n['fits']} rows per rank fit ({size['memory_margin']:.0%} of "
                          f"{where}; estimated, each rank measures at start)", highlight=False, soft_wrap=True)
        if "batch_size" in auto:
            console.print(f"# batch_size=auto plan: {auto['batch_size']} x accum {auto['grad_accum']} x "
                          f"{auto['world']} ranks = {auto['global_batch_size']}", highlight=False, soft_wrap=True)
        elif any(n["fits"] == 0 for n in auto["nodes"].values()):
            console.print("# batch_size=auto: not even one row fits on a node by this estimate", highlight=False,
                          soft_wrap=True)
    elif size:
        console.print(f"# model {size['name']}: {size['parameters'] / 1e6:.2f}M parameters; per rank about "
                      f"{size['total_bytes'] / gib:.2f} GiB ({size['states_bytes'] / gib:.2f} weights, gradients and "
                      f"optimizer states, {size['activation_bytes'] / gib:.2f} activations at batch "
                      f"{size['batch_size']} per rank)", highlight=False, soft_wrap=True)
    return 0


def finish(result: RunResult, prep: LaunchPlan, as_json: bool, console: Console, err: Console,
           extra: dict | None = None) -> int:
    """The run's last line (or its JSON document, with ``extra``), and the command's exit code."""
    if as_json:
        doc = {"run_id": prep.run_id, "exit_code": result.code, "ok": result.code == 0, "reason": result.reason,
               "failed_node": result.failed_node, "failed_rank": result.failed_rank, "seconds": round(result.seconds, 3),
               "left_running": result.left_running, **(extra or {})}
        console.print_json(json.dumps(doc))
    if result.code == 0:
        if not as_json:
            console.print(f"[green]done[/green] {escape(summary_line(result))}", highlight=False)
        return 0
    err.print(f"{'' if result.interrupted else 'error: '}{summary_line(result)}; logs in runs/{prep.run_id}/",
              markup=False, highlight=False,
              soft_wrap=True)
    return result.code
