"""`hrmctl test-ddp`'s result: auralm.ddp_check's JSON (rank 0's HRMCTL_RESULT line) as rich tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


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
