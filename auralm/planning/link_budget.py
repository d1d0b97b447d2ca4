"""What a link means for training: from test-ddp's measured all-reduce figures and a model's size and
compute time, the communication each way of synchronising costs per step, and which way to train.

The model of an all-reduce is the ring's, with the figures as auralm.planning.ddp_check defines them:
algbw = bytes / time and busbw = algbw x 2(n-1)/n, so one all-reduce of ``B`` bytes takes
``B x 2(n-1)/n / busbw`` plus, per message, the measured small-message latency. Per optimizer step:

- DDP sends every gradient in fp32 (4 bytes a parameter) in buckets of 25 MiB, one all-reduce each;
  it overlaps them with the backward pass, so a small share of the compute time costs little;
- the bf16 (or fp16) comm hook sends the same buckets at half the bytes;
- PowerSGD (``training.ddp_comm_hook=powersgd``, rank ``r``) sends, per gradient viewed as an n x m
  matrix (its first dimension by the rest), the factors P (n x r) and Q (m x r) in fp32 when that is
  under half the matrix, else the gradient whole, as torch's hook decides; up to three all-reduces a
  bucket (the whole ones, then P, then Q). Only its bytes are modelled, not the compute its
  compression costs;
- DiLoCo (``training.sync=diloco``) all-reduces the pseudo-gradient in bf16 (2 bytes a parameter)
  once per ``H`` local steps (``training.diloco.inner_steps``), so its share per step is a 1/H of that;
  quantised (``training.diloco.compress=int8|int4``: auralm.parallel.compress) a round sends about 1 or 1/2
  byte a parameter through the same ring.

When the ranks' compute times are known and differ, the work shares (``training.balance=auto``) are
reckoned too: with equal shares a DDP step waits for the slowest rank, ``max(s_r)``; with shares in
proportion to speed the global batch goes at the ranks' summed speed, ``n / sum(1/s_r)``, and a DiLoCo
round at the fastest rank's pace, ``min(s_r)`` a local step. When that gains at least BALANCE_GAIN,
``training.balance=auto`` joins the suggestion and the ratios are taken against the balanced times.

The suggestion: plain DDP when its communication is at most DDP_OK of the compute, the bf16 hook
when that brings it there, else DiLoCo with the smallest round H that brings its share to at most
DILOCO_OK if the ranks wait for it, sent as the least compressed of bf16, int8 and int4 that reaches the smallest such
H (``training.diloco.compress``: fewer local steps a round keep DiLoCo nearer DDP, and the rounding's remainder is
carried to the next round, so compression costs the average little), and with ``training.diloco.overlap_steps`` set
to the local steps
whose compute covers one synchronisation, so that they need not (its outer step is left to the trainer's
default, ``training.diloco.outer_lr=auto``: the ranks' plain average for a run of fewer than FEW_ROUNDS
rounds, the paper's step otherwise). The words for a suggested strategy, and for what work shares do to its pace,
are its registration's (auralm.parallel.strategy: ``named``, ``paced``). Plain dicts in and out; no torch, but
advise(), which asks the run's sync strategy what it sends each step (its ``link_cost``) and so imports its class.
advice() is hrmctl train's warning, asked of the launcher's plan process (auralm.planning.server).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from auralm.parallel import strategy
from auralm.parallel.compress import bytes_per_value
from auralm.models.args import ModelArgs

DDP_BUCKET_BYTES = 25 * 1024 ** 2  # DistributedDataParallel's bucket_cap_mb=25
DDP_OK = 0.15  # DDP's communication at most this share of the compute: hidden behind the backward pass
DILOCO_OK = 0.05  # DiLoCo's synchronisation blocks every rank: keep it to this share of the compute
ROUND_H = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
BALANCE_GAIN = 1.15  # suggest training.balance=auto when it makes a DDP step at least this much shorter
POWERSGD_MIN_COMPRESSION = 2  # torch's PowerSGDState(min_compression_rate=2): compress only what halves
DILOCO_USUAL_MAX_H = 1000  # beyond this many inner steps, DiLoCo is outside what it is usually run with
FEW_ROUNDS = 20  # a DiLoCo run of fewer rounds takes the ranks' plain average as its outer step by default: in the
# range measured (docs/lowcomm.md: 6 and 18 rounds) the paper's outer step ended 5.4% and 7.1% above DDP's loss
AVERAGE = ("training.diloco.outer_lr=1", "training.diloco.outer_momentum=0")  # the outer step = the ranks' average
PAPER_STEP = ("training.diloco.outer_lr=0.7", "training.diloco.outer_momentum=0.9")  # DiLoCo's paper: Nesterov SGD
DEFAULT_LM_VOCAB = 8192  # hrmctl prepare-data's default --vocab-size
WIRE_KINDS = ("bf16", "int8", "int4")  # DiLoCo's rounds as the budget may suggest them, least compressed first
MAX_FRAGMENTS = 16  # Streaming DiLoCo's parts the budget may suggest: beyond, a part's all-reduce is mostly latency
STREAM_OK = 0.01  # a round's all-reduce over this share of its compute travels during the next local steps (overlap)


def ring_factor(world: int) -> float:
    """The bytes each rank sends per byte all-reduced on a ring, 2(n-1)/n (0 alone)."""
    return 2 * (world - 1) / world if world > 1 else 0.0


def allreduce_s(nbytes: float, world: int, busbw_GBps: float, latency_s: float, messages: int) -> float:
    """Seconds for all-reducing ``nbytes`` in ``messages`` all-reduces on a ring of ``world`` ranks."""
    if world <= 1 or nbytes <= 0:
        return 0.0
    return nbytes * ring_factor(world) / (busbw_GBps * 1e9) + messages * latency_s


def buckets(nbytes: float) -> int:
    return max(1, math.ceil(nbytes / DDP_BUCKET_BYTES))


def round_sync(kind: str, parameters: int, world: int, busbw_GBps: float, latency_s: float) -> tuple[float, float]:
    """(bytes, seconds) of one DiLoCo round's all-reduce of ``parameters`` sent as ``kind``, in DDP-sized buckets."""
    sent = bytes_per_value(kind) * parameters
    return sent, allreduce_s(sent, world, busbw_GBps, latency_s, buckets(sent))


def link_from_rows(rows: list[dict]) -> tuple[float, int] | None:
    """(busbw in GB/s, the message size it was measured at) from ddp_check's bandwidth rows: the best of the two
    largest sizes measured (the closest to a DDP bucket; one noisy round does not decide)."""
    rows = sorted((r for r in rows if r.get("busbw_GBps", 0) > 0), key=lambda r: r["bytes"])[-2:]
    if not rows:
        return None
    best = max(rows, key=lambda r: r["busbw_GBps"])
    return best["busbw_GBps"], best["bytes"]


def _ratio(comm_s: float, compute_s: float | None) -> float | None:
    return comm_s / compute_s if compute_s and compute_s > 0 else None


def powersgd_elements(shapes: list[tuple[int, ...]], rank: int) -> int:
    """The elements PowerSGD all-reduces per step for gradients of these shapes, as torch's powerSGD_hook decides:
    each viewed as (n, m) = (its first dimension, the rest), r = min(n, m, rank); P and Q, (n + m) r elements,
    when that times POWERSGD_MIN_COMPRESSION is under n m, else the n m elements as they are."""
    total = 0
    for shape in shapes:
        numel = math.prod(shape)
        n = shape[0] if shape else 1
        m = numel // n if n else 0
        factors = (n + m) * min(n, m, rank)
        total += factors if factors * POWERSGD_MIN_COMPRESSION < numel else numel
    return total


def shares(s_by_rank: list[float] | None) -> dict | None:
    """The ranks' compute per step under equal shares and under shares in proportion to speed (see the module's
    text): {"s_by_rank", "equal_s", "auto_s", "diloco_s", "gain", "suggest"}; None with fewer than two times."""
    if not s_by_rank or len(s_by_rank) < 2 or min(s_by_rank) <= 0:
        return None
    equal, auto = max(s_by_rank), len(s_by_rank) / sum(1 / s for s in s_by_rank)
    return {"s_by_rank": list(s_by_rank), "equal_s": equal, "auto_s": auto, "diloco_s": min(s_by_rank),
            "gain": equal / auto, "suggest": equal / auto >= BALANCE_GAIN}


def budget(*, busbw_GBps: float, latency_us: float, world: int, parameters: int, compute_s: float | None,
           powersgd: dict | None = None,
           compute_by_rank: list[float] | None = None, max_steps: int | None = None) -> dict:
    """Per-step communication of DDP (fp32), DDP with the bf16 hook, with PowerSGD (``powersgd``: {"rank",
    "elements"} from powersgd_elements) and DiLoCo, against ``compute_s`` (seconds of compute per optimizer step on
    the slowest rank; None when unknown) or, when ``compute_by_rank`` (every rank's) calls for work shares, the
    balanced times; and the suggestion."""
    lat = latency_us / 1e6
    bal = shares(compute_by_rank)
    ddp_compute, diloco_compute = (bal["auto_s"], bal["diloco_s"]) if bal and bal["suggest"] else (compute_s, compute_s)
    grad = 4 * parameters
    n_buckets = buckets(grad)
    ddp_s = allreduce_s(grad, world, busbw_GBps, lat, n_buckets)
    half_s = allreduce_s(grad / 2, world, busbw_GBps, lat, n_buckets)  # the hook compresses each fp32 bucket
    by_kind = {}
    for kind in WIRE_KINDS:
        sent, sync = round_sync(kind, parameters, world, busbw_GBps, lat)
        by_kind[kind] = {"bytes_per_sync": round(sent), "comm_s_per_sync": sync,
                         "inner_steps": diloco_steps(sync, diloco_compute)}
    def rank(kind: str) -> tuple:  # the smallest H; where no H is enough (the largest), the least time a round
        h, sync = by_kind[kind]["inner_steps"] or 0, by_kind[kind]["comm_s_per_sync"]
        short = h and sync / h > DILOCO_OK * diloco_compute
        return h, sync if short else 0.0, WIRE_KINDS.index(kind)

    compress = min(WIRE_KINDS, key=rank)
    pseudo, sync_s = by_kind[compress]["bytes_per_sync"], by_kind[compress]["comm_s_per_sync"]
    out = {"world": world, "parameters": parameters, "busbw_GBps": busbw_GBps, "latency_us": latency_us,
           "compute_s": compute_s, "balance": bal, "max_steps": max_steps,
           "ddp": {"bytes": grad, "buckets": n_buckets, "comm_s": ddp_s, "compute_s": ddp_compute,
                   "ratio": _ratio(ddp_s, ddp_compute)},
           "ddp_bf16": {"bytes": grad // 2, "buckets": n_buckets, "comm_s": half_s, "compute_s": ddp_compute,
                        "ratio": _ratio(half_s, ddp_compute)},
           "ddp_powersgd": None,
           "thresholds": {"ddp": DDP_OK, "diloco": DILOCO_OK, "balance_gain": BALANCE_GAIN}}
    if powersgd:
        low = 4 * powersgd["elements"]
        low_s = allreduce_s(low, world, busbw_GBps, lat, 3 * n_buckets)  # whole tensors, P, Q: one after another
        out["ddp_powersgd"] = {"rank": powersgd["rank"], "bytes": low, "buckets": n_buckets, "comm_s": low_s,
                               "compute_s": ddp_compute, "ratio": _ratio(low_s, ddp_compute)}
    H = diloco_steps(sync_s, diloco_compute)
    out["diloco"] = {"compress": compress, "by_compress": by_kind, "bytes_per_sync": pseudo,
                     "comm_s_per_sync": sync_s, "inner_steps": H,
                     "comm_s_per_step": sync_s / H if H else None, "compute_s": diloco_compute,
                     "ratio": _ratio(sync_s / H, diloco_compute) if H else None,
                     "overlap_steps": overlap_steps(sync_s, diloco_compute, H)}
    out["suggestion"] = suggest(out)
    out["text"] = describe(out)
    return out


def compress_for(b: dict, inner_steps: int) -> dict | None:
    """DiLoCo's wire for a run of rounds of ``inner_steps`` on this budget's link: the least compressed of bf16,
    int8 and int4 whose round costs at most DILOCO_OK of the round's compute, else the most compressed; with the
    figures that say why. None when the compute time is unknown."""
    compute_s = b["diloco"]["compute_s"]
    if not compute_s or compute_s <= 0 or inner_steps < 1:
        return None
    by_kind, round_s = b["diloco"]["by_compress"], inner_steps * compute_s
    kind = next((k for k in WIRE_KINDS if by_kind[k]["comm_s_per_sync"] <= DILOCO_OK * round_s), WIRE_KINDS[-1])
    sync = by_kind[kind]["comm_s_per_sync"]
    fits = sync <= DILOCO_OK * round_s
    why = (f"a round of {inner_steps} steps computes for ~{seconds(round_s)}; sent as {kind} "
           f"({human_bytes(by_kind[kind]['bytes_per_sync'])}) it takes ~{seconds(sync)} on this link, "
           + (f"within {DILOCO_OK:.0%} of that" if fits else f"the least of the three, still over {DILOCO_OK:.0%} "
              f"of it (fewer bytes need a larger training.diloco.inner_steps)"))
    if kind != WIRE_KINDS[0]:
        why += f"; as {WIRE_KINDS[0]} ~{seconds(by_kind[WIRE_KINDS[0]]['comm_s_per_sync'])}"
    return {"compress": kind, "why": why}


def fragments_for(b: dict, inner_steps: int, kind: str) -> dict | None:
    """Streaming DiLoCo for a run of rounds of ``inner_steps`` sent as ``kind`` on this budget's link, when one round's
    all-reduce would take more than STREAM_OK of the round's compute (a wait the ranks can be spared: the update then
    lands a step or so late, which costs DiLoCo little): it travels during the local steps after it is
    sent (``training.diloco.overlap_steps``) so that no rank waits for it, and when it needs more than one local step
    it is cut into P parts (``training.diloco.fragments``, at most MAX_FRAGMENTS) of one step's traffic each, so
    that each part's outer step lands a step late rather than the whole update K steps late.
    {"fragments", "overlap_steps", "why"}; "fragments" None when a round's traffic outlasts the round's local steps
    (no split hides it: a larger H does). None when the round fits whole, or the compute time is unknown."""
    compute_s = b["diloco"]["compute_s"]
    if not compute_s or compute_s <= 0 or inner_steps < 2 or b["world"] <= 1:
        return None
    sent, sync = round_sync(kind, b["parameters"], b["world"], b["busbw_GBps"], b["latency_us"] / 1e6)
    round_s = inner_steps * compute_s
    if sync <= STREAM_OK * round_s:
        return None
    head = (f"a round of {inner_steps} steps computes for ~{seconds(round_s)} and its all-reduce as {kind} "
            f"({human_bytes(sent)}) takes ~{seconds(sync)} on this link, {_pct(sync / round_s)} of it")
    whole = math.ceil(sync / compute_s)  # the local steps the whole round's all-reduce needs
    parts = min(whole, MAX_FRAGMENTS)
    k = math.ceil(sync / parts / compute_s)
    if whole >= inner_steps or k * parts > inner_steps:  # still in flight when the next is due: the round waits
        return {"fragments": None, "overlap_steps": None,
                "why": head + f" and longer than its local steps can cover ({whole} of {inner_steps}): a larger "
                              "training.diloco.inner_steps (or fewer bytes) makes it fit"}
    steps = f"{k} local step{'s' if k > 1 else ''}"
    how = (f"travelling during the {steps} after the round, no rank waits for it" if parts == 1 else
           f"in {parts} parts of ~{seconds(sync / parts)}, each travelling during the {steps} after it is sent, no "
           f"rank waits for it and each part's outer step lands {steps} late where the whole round's would land "
           f"{whole} late")
    return {"fragments": parts, "overlap_steps": k, "why": head + ": " + how}


def diloco_steps(sync_s: float, compute_s: float | None) -> int | None:
    """The smallest round H whose synchronisation costs at most DILOCO_OK of H steps' compute (the largest when
    none does); None when the compute time is unknown."""
    if not compute_s or compute_s <= 0:
        return None
    return next((h for h in ROUND_H if sync_s / h <= DILOCO_OK * compute_s), ROUND_H[-1])


def overlap_steps(sync_s: float, compute_s: float | None, inner_steps: int | None) -> int | None:
    """The local steps whose compute covers one synchronisation (``training.diloco.overlap_steps``: the all-reduce
    travels meanwhile), when fewer than the round; else None."""
    if not inner_steps or not compute_s or compute_s <= 0:
        return None
    k = max(1, math.ceil(sync_s / compute_s))
    return k if k < inner_steps else None


def suggest(b: dict) -> dict | None:
    """{"sync", "ddp_comm_hook", "inner_steps", "balance", "overrides", "why"}: what to train with on this link,
    and with which shares."""
    s = _sync_suggestion(b)
    if s is None:
        return None
    s["balance"] = "equal"
    bal = b.get("balance")
    if b["world"] > 1 and bal and bal["suggest"]:
        s["balance"] = "auto"
        s["overrides"] = ["training.balance=auto", *s["overrides"]]
        pace = strategy.entry(s["sync"]).paced.format(**{k: seconds(v) for k, v in bal.items() if k.endswith("_s")})
        s["why"] += (f"; the ranks compute a step in {seconds(min(bal['s_by_rank']))} to "
                     f"{seconds(max(bal['s_by_rank']))}: with shares in proportion to their speed {pace} "
                     f"({bal['gain']:.2f}x the samples/s of equal shares)")
    return s


def _sync_suggestion(b: dict) -> dict | None:
    """{"sync", "ddp_comm_hook", "inner_steps", "overrides", "why"}: how to synchronise on this link."""
    if b["world"] <= 1:
        return {"sync": "ddp", "ddp_comm_hook": "none", "inner_steps": None, "overrides": [],
                "why": "one rank: nothing is communicated"}
    if b["ddp"]["ratio"] is None:
        return None
    if b["ddp"]["ratio"] <= DDP_OK:
        return {"sync": "ddp", "ddp_comm_hook": "none", "inner_steps": None, "overrides": [],
                "why": f"DDP's communication is {_pct(b['ddp']['ratio'])} of the compute, hidden behind the "
                       f"backward pass"}
    if b["ddp_bf16"]["ratio"] <= DDP_OK:
        return {"sync": "ddp", "ddp_comm_hook": "bf16", "inner_steps": None,
                "overrides": ["training.ddp_comm_hook=bf16"],
                "why": f"the bf16 hook brings DDP's communication from {_pct(b['ddp']['ratio'])} to "
                       f"{_pct(b['ddp_bf16']['ratio'])} of the compute"}
    d = b["diloco"]
    why = (f"DDP's communication would be {_pct(b['ddp']['ratio'])} of the compute ({_pct(b['ddp_bf16']['ratio'])} "
           f"with the bf16 hook); DiLoCo with H={d['inner_steps']} brings it to {_pct(d['ratio'])}")
    if d["ratio"] > DILOCO_OK:
        why += f", still above {_pct(DILOCO_OK)}: this link is too slow for this model, even with DiLoCo"
    elif d["inner_steps"] > DILOCO_USUAL_MAX_H:
        why += f" (more inner steps than DiLoCo is usually run with, about {DILOCO_USUAL_MAX_H}: expect it to learn slower)"
    overrides = ["training.sync=diloco", f"training.diloco.inner_steps={d['inner_steps']}"]
    if d["compress"] != "bf16":
        bf16 = d["by_compress"]["bf16"]
        overrides.append(f"training.diloco.compress={d['compress']}")
        why += (f"; its rounds quantised to {d['compress']} ({human_bytes(d['bytes_per_sync'])} a round against "
                f"{human_bytes(bf16['bytes_per_sync'])} as bf16, the rounding's remainder carried to the next round) "
                f"need H={d['inner_steps']} where bf16's need {bf16['inner_steps']}")
    if d["overlap_steps"]:
        k = d["overlap_steps"]
        overrides.append(f"training.diloco.overlap_steps={k}")
        why += (f"; and with its all-reduce ({seconds(d['comm_s_per_sync'])}) travelling during the next round's "
                f"first {k} local step{'s' if k > 1 else ''} the ranks need not wait for it")
    rounds = b["max_steps"] // d["inner_steps"] if b["max_steps"] else None  # None: the run's length is unknown
    if rounds is not None and rounds < FEW_ROUNDS:  # the default outer step (auto) is the average then: no override
        why += (f"; this run has {rounds} round{'s' if rounds != 1 else ''}: with so few the default outer step "
                f"(training.diloco.outer_lr=auto) is the ranks' plain average, which kept the loss within 2% of DDP's "
                f"where the paper's outer step ended 5.4-7.1% above it (docs/lowcomm.md)")
    return {"sync": "diloco", "ddp_comm_hook": "none", "inner_steps": d["inner_steps"], "compress": d["compress"],
            "overlap_steps": d["overlap_steps"], "overrides": overrides, "why": why}


def _pct(r: float | None) -> str:
    if r is None:
        return "?"
    return f"{r * 100:.0f}%" if r >= 0.1 else f"{r * 100:.1f}%" if r >= 0.001 else f"{r * 100:.2g}%"


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return f"{n:g}"


def seconds(s: float | None) -> str:
    if s is None:
        return "?"
    return f"{s:.3g} s" if s >= 0.01 else f"{s * 1e3:.3g} ms"


def describe(b: dict) -> str:
    """One paragraph: the figures and the suggestion."""
    if b["world"] <= 1:
        return "One rank: nothing is communicated, any synchronisation costs nothing."
    ddp, half, dl = b["ddp"], b["ddp_bf16"], b["diloco"]
    text = (f"On this link ({b['world']} ranks, bus bandwidth {b['busbw_GBps'] * 1e3:.3g} MB/s, all_reduce latency "
            f"{b['latency_us']:.0f} us), a DDP step of {b['parameters'] / 1e6:.2f}M parameters sends "
            f"{human_bytes(ddp['bytes'])} of fp32 gradients in {ddp['buckets']} bucket(s): about "
            f"{seconds(ddp['comm_s'])} of communication per step")
    if b["compute_s"] is None:
        return text + "; the compute time per step is unknown, so no suggestion."
    bal = b.get("balance")
    against = (f"{seconds(bal['auto_s'])} of compute with work shares ({seconds(b['compute_s'])} with equal ones)"
               if bal and bal["suggest"] else f"{seconds(b['compute_s'])} of compute")
    text += (f" against {against} ({_pct(ddp['ratio'])}). The bf16 hook halves it to "
             f"{seconds(half['comm_s'])} ({_pct(half['ratio'])})")
    low = b.get("ddp_powersgd")
    if low:
        text += (f"; PowerSGD at rank {low['rank']} sends {human_bytes(low['bytes'])}, {seconds(low['comm_s'])} "
                 f"({_pct(low['ratio'])}, plus the compute of its compression)")
    text += (f"; DiLoCo with H={dl['inner_steps']} sends {human_bytes(dl['bytes_per_sync'])} of {dl['compress']} "
             f"pseudo-gradient once per {dl['inner_steps']} steps, {seconds(dl['comm_s_per_step'])} per step "
             f"({_pct(dl['ratio'])}).")
    s = b["suggestion"]
    return text + " " + suggestion_line(s) + "."


def suggestion_line(s: dict | None) -> str:
    if s is None:
        return "No suggestion (the compute time per step is unknown)"
    how = f": {' '.join(s['overrides'])}" if s["overrides"] else " (the default, no override)"
    return f"Suggestion: {suggestion_name(s)}{how} — {s['why']}"


def suggestion_name(s: dict) -> str:
    """"plain DDP", "DDP with the bf16 hook" or "DiLoCo with H=50" (as the suggested strategy's registration names
    it), with ", work shares by speed" when it has them."""
    return strategy.entry(s["sync"]).named(s) + (", work shares by speed" if s.get("balance") == "auto" else "")


def shares_line(bal: dict) -> str:
    """The ranks' compute per step, and a step's under equal shares and under shares by speed."""
    return (f"ranks' compute per step {', '.join(seconds(t) for t in bal['s_by_rank'])}: {seconds(bal['equal_s'])} a "
            f"step with equal shares, {seconds(bal['auto_s'])} with shares by speed ({bal['gain']:.2f}x the samples/s)")


def rows(b: dict) -> list[tuple[str, float, float | None, float | None, float | None]]:
    """The table of a budget: (way of synchronising, bytes per step, communication s per step, compute s per step,
    comm / compute); the compute is the balanced one when the suggestion has work shares."""
    low, dl = b.get("ddp_powersgd"), b["diloco"]
    parts = [("ddp (fp32 gradients)", b["ddp"]), ("ddp + bf16 hook", b["ddp_bf16"])]
    if low:
        parts.append((f"ddp + powersgd r={low['rank']}", low))
    out = [(label, p["bytes"], p["comm_s"], p["compute_s"], p["ratio"]) for label, p in parts]
    if dl.get("inner_steps"):
        out.append((f"diloco H={dl['inner_steps']} ({dl['compress']}, once per H)", dl["bytes_per_sync"] / dl["inner_steps"],
                    dl["comm_s_per_step"], dl["compute_s"], dl["ratio"]))
    return out


# ---------------------------------------------------------------- the model a run trains, and hrmctl train's warning


def lm_vocab(data_dir: str | Path) -> int:
    """The vocabulary of the prepared text in ``data_dir`` (its manifest), else prepare-data's default."""
    try:
        return int(json.loads((Path(data_dir) / "meta.json").read_text())["tokenizer"]["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_LM_VOCAB


def scaled_compute(cached: dict, run: dict) -> tuple[float, bool]:
    """This run's compute seconds per step from the one measured for ``cached`` (both {"spec", "parameters",
    "batch_size", "grad_accum", "tokens_per_sample", "s_per_step"}): exact up to the batch when the model is the
    same (same spec), else scaled by parameters x tokens x passes (an estimate). -> (seconds, estimated)."""
    per_batch = cached["s_per_step"] / cached.get("grad_accum", 1)
    if not run.get("batch_size"):  # batch_size=auto: chosen at start; reckoned at the measured batch
        run = dict(run, batch_size=cached["batch_size"])
    if cached.get("spec") == run.get("spec"):
        return per_batch * run["batch_size"] / cached["batch_size"] * run.get("grad_accum", 1), \
            run["batch_size"] != cached["batch_size"]
    work = lambda m: m["parameters"] * m["batch_size"] * m.get("tokens_per_sample", 1) * m.get("passes", 1)  # noqa: E731
    return per_batch * work(run) / work(cached) * run.get("grad_accum", 1), True


def age(seconds_ago: float) -> str:
    if seconds_ago < 120:
        return "just now"
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds_ago >= size:
            n = seconds_ago / size
            return f"{n:.0f} {unit}{'s' if unit == 'day' and n >= 1.5 else ''} ago"
    return ""


def advise(link: dict, run: dict, *, world: int, sync: str = "ddp", hook: str = "none", balance: str = "equal",
           now: float | None = None, parallel: str = "ddp", inner_steps: int | None = None) -> dict:
    """hrmctl train's look at a cached link (``link``: one entry of links.json) for this run's model (``run``: as in
    scaled_compute, with "name" and "powersgd"): {"warn", "line", "budget", "compute_s", "estimated", ...}. ``warn``
    when this run's DDP communication (its comm hook, its shares) would take longer than its compute, or when its
    ranks differ in speed (test-ddp timed each) and it gives them equal shares."""
    compute_s, estimated = scaled_compute(link["compute"], run)
    measured = link["compute"].get("s_per_step_by_rank")
    by_rank = [t * compute_s / max(measured) for t in measured] if measured and min(measured) > 0 else None
    b = budget(busbw_GBps=link["busbw_GBps"], latency_us=link["latency_us"], world=world,
               parameters=run["parameters"], compute_s=compute_s, powersgd=run.get("powersgd"),
               compute_by_rank=by_rank if by_rank and len(by_rank) == world else None, max_steps=run.get("max_steps"))
    out = {"warn": False, "line": None, "budget": b, "compute_s": compute_s, "estimated": estimated,
           "sync": sync, "ddp_comm_hook": hook, "balance": balance, "measured_at": link.get("measured_at")}
    if world <= 1:
        return out
    if inner_steps:  # DiLoCo's rounds: the wire this link and model call for (hrmctl train's default)
        out["diloco_compress"] = compress_for(b, inner_steps)
        out["diloco_fragments"] = {kind: fragments_for(b, inner_steps, kind) for kind in ("none", *WIRE_KINDS)}
    s, bal = b["suggestion"], b["balance"]
    when = age((now or time.time()) - link["measured_at"]) if link.get("measured_at") else ""
    how = ("estimate: scaled from the " + ("same model at batch " if link["compute"].get("spec") == run.get("spec")
                                           else f"model {link['compute'].get('name')} at batch ")
           + f"{link['compute']['batch_size']} measured by test-ddp") if estimated else "measured by test-ddp"
    nodes = ",".join(link.get("nodes", []))
    mode = strategy.strategy_class(sync, parallel)  # what this run's sync strategy sends every step, if anything
    mine = mode.link_cost(b, hook)
    if mine:
        step_s = bal["auto_s"] if bal and balance != "equal" else compute_s  # the compute of this run's steps
        out["comm_s"], out["ratio"] = mine["comm_s"], _ratio(mine["comm_s"], step_s)
        if out["ratio"] is not None and out["ratio"] > 1:
            wire = (f"PowerSGD rank-{mine['rank']} factors" if hook == "powersgd" else
                    f"{hook} gradients" if hook in ("bf16", "fp16") else "fp32 gradients")
            out["warn"] = True
            out["line"] = (f"{nodes}: DDP would spend ~{seconds(mine['comm_s'])} per step communicating "
                           f"({run['parameters'] / 1e6:.2f}M parameters as {wire} at {link['busbw_GBps'] * 1e3:.3g} "
                           f"MB/s bus bandwidth, test-ddp {when}) against ~{seconds(step_s)} of compute ({how}): "
                           "communication dominates; " + (f"try {' '.join(s['overrides'])}" if s and s["overrides"]
                                                          else "check the link with hrmctl test-ddp"))
            return out
    if balance == "equal" and bal and bal["suggest"]:
        out["warn"] = True
        waits = mode.waits
        out["line"] = (f"{nodes}: the ranks compute a step in {seconds(min(bal['s_by_rank']))} to "
                       f"{seconds(max(bal['s_by_rank']))} (test-ddp {when}) and this run gives them equal shares: "
                       f"{waits}; try training.balance=auto (about {bal['gain']:.2f}x the samples/s)")
    return out


def passes(arch: ModelArgs, family: str) -> float:
    """How many times a step runs the model's layers, as forward-pass equivalents (a backward costs about two
    forwards): as the family declares it (auralm.models.registry; 1 for GPT and the sudoku transformer, more for
    the recurrent models, which run their layers several times a segment)."""
    from auralm.models import registry

    return registry.get(family).passes(arch)


def run_model(cfg, world: int) -> dict:
    """The model a trainer config trains, as advise() and the cache describe it (imports torch: the parameters
    are counted on the meta device)."""
    from auralm import models, tasks
    from auralm.planning import sizing
    from auralm.training import config

    sizing.per_rank(cfg, world)
    arch = config.resolved_model(cfg.model)
    task = tasks.get(cfg.task)
    vocab = lm_vocab(cfg.data_dir or f"data/{cfg.task}") if task.tokenized else None
    shapes = sizing.parameter_shapes(cfg.task, arch, vocab)
    rank = cfg.training.powersgd_rank
    return {"name": cfg.model.name, "task": cfg.task, "parameters": sum(math.prod(s) for s in shapes),
            "powersgd": {"rank": rank, "elements": powersgd_elements(shapes, rank)},
            "batch_size": cfg.training.batch_size, "grad_accum": cfg.training.grad_accum,
            "max_steps": cfg.training.max_steps,
            "tokens_per_sample": task.positions(arch), "vocab": vocab,
            "passes": passes(arch, models.family_of(cfg.task, arch)),
            "spec": json.dumps({"task": cfg.task, "arch": arch.to_dict(), "vocab": vocab}, sort_keys=True)}


def advice(args: list[str], link: dict, world: int | None = None) -> dict:
    """advise() for the run a command line gives, on a link cache entry (cli/launch/plan/link_cache.py): the plan
    process's "link" (auralm.planning.server). Raises UserError (or ValueError, KeyError) on what it cannot read."""
    from auralm.training import command_line

    cfg = command_line.parse(args)
    world = world or link["world"]
    t = cfg.training
    return advise(link, run_model(cfg, world), world=world, sync=t.sync, hook=t.ddp_comm_hook, balance=t.balance,
                  parallel=t.parallel, inner_steps=strategy.strategy_class(t.sync, t.parallel).steps_a_round(t))
