"""What test-ddp measured of each set of nodes, kept for `hrmctl train`: the link cache and train's warning.

`hrmctl test-ddp` saves, per set of nodes (the sorted names), the bus bandwidth and latency it measured,
the world, backend and time, and the compute time per step of the model it timed, the slowest rank's and
every rank's (auralm.planning.ddp_check's `training` section) in links.json under hrmctl's cache directory
($HRMCTL_CACHE, else $XDG_CACHE_HOME/hrmctl, else ~/.cache/hrmctl). Before a multi-node `hrmctl train`,
the entry of its nodes, if any, is handed with the run's overrides to auralm.planning.link_budget (asked of the
launch's plan process, planner.py, at once so that it runs beside the preflight; it sizes the run's model on the meta
device and scales the cached compute to it). When DDP's communication (with the run's comm hook, PowerSGD
included) would take longer than the compute, or when the ranks differ in speed and the run gives them
equal shares, one warning line says so with the figures and the overrides to try. Under DiLoCo, when the run does
not set ``training.diloco.compress``, its rounds are sent as the budget's wire for the run's H on this link (the
least compressed whose round fits; link_budget.compress_for); when it sets neither ``training.diloco.fragments`` nor
``overlap_steps`` and a round's all-reduce would take over 1% of the round's compute, it travels during the local
steps after it, cut in parts of a step's traffic each when it needs more than one (link_budget.fragments_for); a run
of rounds waits for the advice before its plan, any other run only when it prints the warning. Each choice is said in
one line. Never an error, never a reason not to run: anything missing or failing here is silence.
"""

from __future__ import annotations

import time
from pathlib import Path

from auralm.parallel import strategy
from cli import cache
from cli.cache import cache_dir
from cli.launch.plan import planner
from cli.nodes.inventory import Node
from cli.launch.plan.options import TRAINER

ADVICE_TIMEOUT_S = 20  # a launch waits this long for the advice, then goes on without it
ADVICE_DRY_RUN_TIMEOUT_S = 180  # a dry run, which shows the advice and launches nothing, waits longer (a busy machine)


def cache_path() -> Path:
    return cache_dir() / "links.json"


def key(names: list[str]) -> str:
    return ",".join(sorted(names))


def load_all() -> dict:
    return cache.load(cache_path())


def load(names: list[str]) -> dict | None:
    entry = load_all().get(key(names))
    return entry if isinstance(entry, dict) else None


def entry_from_result(result: dict, names: list[str], now: float | None = None) -> dict | None:
    """The cache entry for a test-ddp result (ddp_check's JSON), or None when it measured no link or compute."""
    tr = result.get("training") or {}
    compute = tr.get("compute") or {}
    if not tr or not result.get("ok") or result.get("world_size", 1) < 2 or not compute.get("s_per_step"):
        return None
    model = tr["model"]
    return {"nodes": sorted(names), "world": result["world_size"], "backend": result.get("backend"),
            "busbw_GBps": tr["busbw_GBps"], "bandwidth_bytes": tr.get("bandwidth_bytes"),
            "latency_us": tr["latency_us"], "measured_at": now or time.time(),
            "compute": {"s_per_step": compute["s_per_step"], "steps_timed": compute["steps_timed"],
                        "s_per_step_by_rank": compute.get("s_per_step_by_rank"),
                        **{k: model[k] for k in ("name", "task", "parameters", "batch_size", "grad_accum",
                                                 "tokens_per_sample", "passes", "vocab", "spec")
                           if k in model}}}


def save(entry: dict) -> Path:
    """Write ``entry`` under its nodes' key (atomically: a temporary file renamed over links.json)."""
    path = cache_path()
    data = load_all()
    data[key(entry["nodes"])] = entry
    if not cache.save(path, data):
        raise OSError(f"cannot write {path}")
    return path


def remember(result: dict | None, nodes: list[Node]) -> Path | None:
    """test-ddp's result into the cache, when it measured a link and a compute time; never raises."""
    try:
        entry = entry_from_result(result or {}, [n.name for n in nodes])
        return save(entry) if entry else None
    except (OSError, KeyError, TypeError, ValueError):
        return None


Advice = planner.Answer  # auralm.planning.link_budget's advice for a run; ``result()`` waits for it (briefly)


def advise(entry: dict, args: list[str], world: int | None, timeout_s: float = ADVICE_TIMEOUT_S) -> Advice:
    """The advice for this run on the cached link ``entry``, asked of the plan process now."""
    return planner.ask("link", timeout_s, args=list(args), world=world, link=entry)


def start(opts) -> Advice | None:
    """The advice for a multi-node run of the trainer with a cached link, started; None when there is nothing to say."""
    if opts.module != TRAINER or len(opts.nodes) < 2:
        return None
    entry = load([n.name for n in opts.nodes])
    if not entry:
        return None
    world = opts.nproc * len(opts.nodes) if opts.nproc else None  # else the world test-ddp saw on these nodes
    return advise(entry, opts.args, world, ADVICE_DRY_RUN_TIMEOUT_S if opts.dry_run else ADVICE_TIMEOUT_S)


COMPRESS = "training.diloco.compress"
STREAMING = ("training.diloco.fragments", "training.diloco.overlap_steps")


def _given(opts, key: str) -> bool:
    return any(a.partition("=")[0].lstrip("+") == key for a in opts.args)


def _say(err, text: str) -> None:
    err.print(text, markup=False, highlight=False, soft_wrap=True)


def choose_wire(advice: Advice | None, opts, err) -> dict:
    """DiLoCo's rounds on this run's nodes from test-ddp's figures, where the run leaves them to hrmctl: the wire
    (``training.diloco.compress``), then, for the wire in effect, the streaming (``training.diloco.fragments`` and
    ``overlap_steps``, when the run sets neither) that keeps the ranks from waiting for a round's all-reduce. Each
    choice is added to ``opts.args`` and said in one line with the budget's reason and the override that keeps the
    default; a round that no streaming hides is said too. -> {"compress": ..., "fragments": ..., "overlap_steps": ...}
    of what was added (nothing: nothing cached, not a run of rounds, or the defaults already)."""
    chosen = {}
    t = opts.trainer.training if opts.trainer is not None else None
    if advice is None or t is None or not strategy.entry(t.sync, t.parallel).rounds:  # no rounds: launch meanwhile
        return chosen
    res = advice.result() or {}
    default = opts.trainer.training.diloco.compress
    choice = res.get("diloco_compress")
    if choice and choice["compress"] != default and not _given(opts, COMPRESS):
        opts.args = [*opts.args, f"{COMPRESS}={choice['compress']}"]
        chosen["compress"] = choice["compress"]
        _say(err, f"diloco: rounds sent as {choice['compress']}, chosen from test-ddp's figures for "
                  f"{key([n.name for n in opts.nodes])}: {choice['why']}; {COMPRESS}={default} keeps {default}")
    stream = (res.get("diloco_fragments") or {}).get(opts.trainer.training.diloco.compress)
    if not stream or any(_given(opts, k) for k in STREAMING):
        return chosen
    if stream["fragments"] is None:
        _say(err, f"diloco: {stream['why']}")
        return chosen
    d = opts.trainer.training.diloco
    values = {"fragments": stream["fragments"], "overlap_steps": stream["overlap_steps"]}
    added = [f"training.diloco.{k}={v}" for k, v in values.items() if v != getattr(d, k)]
    opts.args = [*opts.args, *added]
    chosen.update(values)
    keeps = " ".join(f"training.diloco.{k}={getattr(d, k)}" for k in values)
    _say(err, f"diloco: {' '.join(added)}, chosen from test-ddp's figures for {key([n.name for n in opts.nodes])}: "
              f"{stream['why']}; {keeps} keeps the defaults")
    return chosen


def summary(advice: Advice | None) -> dict | None:
    """What --json carries: {"warn", "line", "comm_s", "compute_s", "ratio", "estimated", "suggestion", ...}."""
    res = advice.result() if advice else None
    if not res:
        return None
    b = res["budget"]
    return {"warn": res["warn"], "line": res["line"], "comm_s": res.get("comm_s"), "compute_s": res["compute_s"],
            "ratio": res.get("ratio"), "estimated": res["estimated"], "sync": res["sync"],
            "ddp_comm_hook": res["ddp_comm_hook"], "balance": res.get("balance"), "parameters": b["parameters"],
            "world": b["world"], "busbw_GBps": b["busbw_GBps"], "latency_us": b["latency_us"], "measured_at": res["measured_at"],
            "suggestion": b["suggestion"]}


def warn(advice: Advice | None, err) -> dict | None:
    """Print the one warning line (when communication would dominate) on ``err``; the --json field."""
    doc = summary(advice)
    if doc and doc["warn"]:
        err.print(f"[yellow]warning:[/yellow] {_escape(doc['line'])}", highlight=False, soft_wrap=True)
    elif advice is not None and advice.late:
        err.print(f"note: no advice from test-ddp's figures for these nodes: the estimate took over "
                  f"{advice.timeout_s:.0f} s on this machine; going on without it", highlight=False, soft_wrap=True)
    return doc


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(text)
