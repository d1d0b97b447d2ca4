"""What `hrmctl top` shows: a table of nodes and a table of the trainer's ranks, or the same as JSON.

Input: the nodes' latest agent lines (cli/top/watch.py's NodeState; made-up ones in the tests).
`slowest(ranks)` picks, per run, the rank with the lowest step rate (a rank whose progress file stopped
counts as rate 0: "stalled"); `render(states)` is a rich renderable; `snapshot_json(states)` the
document of `--once --json` (and of each line of `--json` without --once).
"""

from __future__ import annotations

import datetime
import math
import time
from typing import Iterable

from rich import box

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .watch import NodeState

SLOWEST = "◀ slowest"
STALL_S = 10.0  # a progress file older than this (and than 5 steps at the rank's rate) is a stalled rank


def human_bytes(n: float | None, per_s: bool = False) -> str:
    if n is None:
        return "–"
    units = ["B", "KB", "MB", "GB", "TB"]
    value, i = float(n), 0
    while value >= 1000 and i < len(units) - 1:
        value, i = value / 1000, i + 1
    text = f"{value:.0f}" if i == 0 or value >= 100 else f"{value:.1f}"
    return f"{text} {units[i]}{'/s' if per_s else ''}"


def human_mem(used: float | None, total: float | None) -> str:
    if used is None or total is None:
        return "–"
    gib = 1024 ** 3
    pct = 100.0 * used / total if total else 0.0
    return f"{used / gib:.1f}/{total / gib:.1f}G {pct:.0f}%"


def stalled(rank: dict) -> bool:
    age, rate = rank.get("age"), rank.get("steps_per_s")
    if age is None:
        return False
    return age > STALL_S and (not rate or age > 5.0 / rate)


def effective_rate(rank: dict) -> float | None:
    """Steps per second as the slowest-rank choice sees it: 0 for a stalled rank, None when unknown."""
    if stalled(rank):
        return 0.0
    rate = rank.get("steps_per_s")
    return float(rate) if isinstance(rate, (int, float)) and math.isfinite(rate) else None


def all_ranks(states: Iterable[NodeState]) -> list[dict]:
    """Every rank of every node, each with its node's name, sorted by run then rank."""
    out = []
    for s in states:
        for r in (s.data or {}).get("ranks") or []:
            out.append(dict(r, node=s.name))
    out.sort(key=lambda r: (str(r.get("run") or ""), r.get("rank", 0), r["node"]))
    return out


def slowest(ranks: list[dict]) -> dict[str, dict]:
    """run -> its slowest rank (lowest effective step rate, then fewest steps), for runs of two ranks or more.
    Each entry also says how far behind the fastest rank it is: {"node", "rank", "behind_pct"}."""
    runs: dict[str, list[dict]] = {}
    for r in ranks:
        if effective_rate(r) is not None:
            runs.setdefault(str(r.get("run") or ""), []).append(r)
    out = {}
    for run, rows in runs.items():
        if len(rows) < 2:
            continue
        slow = min(rows, key=lambda r: (effective_rate(r), r.get("step") or 0, -(r.get("age") or 0), -r.get("rank", 0)))
        fast = max(effective_rate(r) for r in rows)
        behind = 100.0 * (1 - effective_rate(slow) / fast) if fast > 0 else 0.0
        out[run] = {"node": slow["node"], "rank": slow.get("rank"), "behind_pct": round(behind, 1)}
    return out


def _is_slowest(r: dict, marks: dict[str, dict]) -> bool:
    m = marks.get(str(r.get("run") or ""))
    return bool(m) and m["node"] == r["node"] and m["rank"] == r.get("rank")


def _gpu_cells(data: dict) -> tuple[str, str]:
    gpus = data.get("gpus")
    if not gpus:
        return "none", "–"
    util = " ".join(f"{g['util']}%" if g.get("util") is not None else "?" for g in gpus)
    mem = " ".join(human_mem(g.get("mem_used"), g.get("mem_total")).split(" ")[0] for g in gpus)
    return util, mem


WIDE = 110  # narrower than this (a pipe's 80 columns): the less needed columns are left out


def _table(columns: list[tuple[str, str]]) -> Table:
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True, expand=False,
              header_style="bold")
    for name, just in columns:
        t.add_column(name, justify=just, no_wrap=True)
    return t


def node_table(states: list[NodeState], now: float, wide: bool = True) -> Table:
    """One row per node. Narrow: without host and cores."""
    columns = [("node", "left"), ("host", "left"), ("cpu", "right"), ("cores", "right"), ("memory", "right"),
               ("gpu", "right"), ("gpu mem", "right"), ("net ↑", "right"), ("net ↓", "right"), ("ranks", "right"),
               ("seen", "right")]
    keep = [wide or name not in ("host", "cores") for name, _ in columns]
    t = _table([c for c, k in zip(columns, keep) if k])
    for s in states:
        d = s.data or {}
        age = s.age(now)
        seen = "–" if age is None else ("now" if age < 2.5 else f"{age:.0f}s ago")
        if not d:
            cells = [escape(s.name), escape(s.node.host)] + ["–"] * 8 + \
                    ["connecting…" if not s.error else "[red]no answer[/]"]
        else:
            gpu, gpu_mem = _gpu_cells(d)
            cells = [escape(s.name), escape(s.node.host), "–" if d.get("cpu") is None else f"{d['cpu']:.0f}%",
                     str(d.get("cores") or "–"), human_mem(d.get("mem_used"), d.get("mem_total")), gpu, gpu_mem,
                     human_bytes(d.get("net_tx"), True), human_bytes(d.get("net_rx"), True),
                     str(len(d.get("ranks") or [])), seen]
        t.add_row(*[c for c, k in zip(cells, keep) if k], style="red" if s.error else None)
    return t


def rank_table(ranks: list[dict], marks: dict[str, dict], wide: bool = True) -> Table:
    """One row per rank, the slowest of each run marked. Narrow: without rate and rss."""
    columns = [("run", "left"), ("node", "left"), ("rank", "right"), ("step", "right"), ("steps/s", "right"),
               ("loss", "right"), ("rate", "right"), ("sent/round", "right"), ("cpu", "right"), ("rss", "right"),
               ("beat", "right"), ("", "left")]
    rounds = any(r.get("round_bytes") is not None for r in ranks)  # a run that sends rounds (DiLoCo's)
    keep = [(wide or name not in ("rate", "rss", "sent/round")) and (rounds or name != "sent/round")
            for name, _ in columns]
    t = _table([c for c, k in zip(columns, keep) if k])
    for r in ranks:
        rate = r.get("steps_per_s")
        unit = "tok/s" if r.get("unit") == "tokens" else "samples/s"
        age = r.get("age")
        mark = SLOWEST if _is_slowest(r, marks) else ""
        if stalled(r):
            mark = (mark + " stalled").strip()
        cells = [escape(str(r.get("run") or "–")), escape(r["node"]), f"r{r.get('rank', '?')}",
                 "starting" if r.get("step") is None else str(r["step"]),
                 "–" if rate is None else f"{rate:.2f}",
                 "–" if r.get("loss") is None else f"{r['loss']:.4f}",
                 "–" if r.get("rate") is None else f"{r['rate']:.0f} {unit}", human_bytes(r.get("round_bytes")),
                 "–" if r.get("cpu") is None else f"{r['cpu']:.0f}%",
                 human_bytes(r.get("rss")), "–" if age is None else f"{age:.0f}s", mark]
        t.add_row(*[c for c, k in zip(cells, keep) if k], style="bold yellow" if mark else None)
    return t


class Screen:
    """The whole screen, laid out for the width it is drawn at: a header, the nodes, the ranks (or a line
    saying there is no job)."""

    def __init__(self, states: list[NodeState], interval: float, now: float | None, live: bool):
        self.states, self.interval, self.live = states, interval, live
        self.now = time.monotonic() if now is None else now

    def __rich_console__(self, console, options):
        wide = options.max_width >= WIDE
        states = self.states
        clock = datetime.datetime.now().strftime("%H:%M:%S")
        yield Text.assemble(("hrmctl top", "bold"), f"  {len(states)} node{'s' * (len(states) != 1)}  {clock}  "
                            f"every {self.interval:g}s", ("  q quits" if self.live else "", "dim"))
        yield node_table(states, self.now, wide)
        for s in states:
            if s.error:
                yield Text(s.error, style="red")
        ranks = all_ranks(states)
        if not ranks:
            yield Text("no training job on these nodes", style="dim")
            return
        marks = slowest(ranks)
        yield rank_table(ranks, marks, wide)
        for run, m in marks.items():
            yield Text(f"slowest{' of ' + run if run else ''}: {m['node']} r{m['rank']}, "
                       f"{m['behind_pct']:.1f}% below the fastest rank's step rate", style="dim")


def render(states: list[NodeState], *, interval: float = 1.0, now: float | None = None, live: bool = True) -> Screen:
    """What the live view (and --once without --json) draws."""
    return Screen(states, interval, now, live)


def snapshot_json(states: list[NodeState], now: float | None = None) -> dict:
    now = time.monotonic() if now is None else now
    ranks = all_ranks(states)
    marks = slowest(ranks)
    nodes = []
    for s in states:
        d = dict(s.data or {})
        d.pop("ranks", None)
        age = s.age(now)
        nodes.append({"name": s.name, "ok": s.data is not None and s.error is None, "error": s.error,
                      "age_s": None if age is None else round(age, 2), **d})
    for r in ranks:
        r["slowest"] = _is_slowest(r, marks)
        r["stalled"] = stalled(r)
    return {"time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "nodes": nodes,
            "ranks": ranks, "slowest": marks}
