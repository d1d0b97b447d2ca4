"""`hrmctl test-ddp`'s result: auralm.planning.ddp_check's JSON (rank 0's HRMCTL_RESULT line) as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from auralm.planning import link_budget


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g}"


def show(result: dict, console: Console) -> None:
    why = f" ({result['reason']})" if result.get("reason") else ""
    ranks = Table(title=f"test-ddp: world {result['world_size']}, backend {result['backend']}{why}",
                  title_justify="left")
    for col in ("rank", "host", "device", "torch"):
        ranks.add_column(col)
    for r in result["ranks"]:
        ranks.add_row(str(r["rank"]), r["host"], r["device"], r["torch"])
    console.print(ranks)
    checks = Table(title="correctness", title_justify="left")
    checks.add_column("collective")
    checks.add_column("result")
    for name, bad in result["checks"].items():
        checks.add_row(name, "[green]ok[/green]" if not bad else f"[red]WRONG[/red] on ranks {', '.join(map(str, bad))}")
    console.print(checks)
    if result.get("bandwidth"):
        bw = Table(title="all_reduce bandwidth (float32, busbw = algbw x 2(n-1)/n)", title_justify="left")
        for col in ("size", "iters", "time", "algbw GB/s", "busbw GB/s"):
            bw.add_column(col, justify="right")
        for row in result["bandwidth"]:
            bw.add_row(human_bytes(row["bytes"]), str(row["iters"]), f"{row['time_us']:.1f} us",
                       f"{row['algbw_GBps']:.3f}", f"{row['busbw_GBps']:.3f}")
        console.print(bw)
    lat = result.get("latency")
    if lat:
        console.print(f"small-message latency (4 B all_reduce, {lat['iters']} iterations): "
                      f"p50 {lat['p50_us']:.1f} us, mean {lat['mean_us']:.1f} us", highlight=False)
    if result.get("training"):
        show_training(result["training"], console)


def _s(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.3g} s" if x >= 0.01 else f"{x * 1e3:.3g} ms"


def _mb(n: float) -> str:
    return f"{n / 1e6:.3g} MB" if n >= 1e5 else f"{n / 1e3:.3g} KB"


def show_training(tr: dict, console: Console) -> None:
    """What the link means for training (auralm.planning.link_budget's figures, as ddp_check computed them)."""
    m, c = tr["model"], tr["compute"]
    timed = (f"median of {c['steps_timed']} timed step(s) of the slowest rank" if c.get("steps_timed")
             else f"not timed: {c.get('error')}")
    t = Table(title=f"what the link means for training: model {m['name']} ({m['task']}), "
                    f"{m['parameters'] / 1e6:.2f}M parameters, batch {m['batch_size']} x grad_accum {m['grad_accum']} "
                    f"per rank; compute {_s(tr['compute_s'])} per step ({timed})", title_justify="left")
    for col in ("sync", "bytes per step", "comm per step", "compute per step", "comm / compute"):
        t.add_column(col, justify="left" if col == "sync" else "right")
    for label, nbytes, comm, compute, ratio in link_budget.rows(tr):
        t.add_row(label, _mb(nbytes), _s(comm), _s(compute), "-" if ratio is None else f"{ratio:.3f}")
    console.print(t)
    if tr.get("balance"):
        console.print(link_budget.shares_line(tr["balance"]), highlight=False)
    s = tr.get("suggestion")
    if s is None:
        console.print("no suggestion: the compute time per step is unknown", highlight=False)
        return
    what = link_budget.suggestion_name(s) + (" (the default)" if not s["overrides"] else "")
    how = f" — [bold]{escape(' '.join(s['overrides']))}[/bold]" if s["overrides"] else ""
    console.print(f"suggestion: {what}{how} ({escape(s['why'])}); link {tr['busbw_GBps'] * 1e3:.3g} MB/s bus "
                  f"bandwidth, {tr['latency_us']:.0f} us latency, {tr['world']} ranks", highlight=False)
