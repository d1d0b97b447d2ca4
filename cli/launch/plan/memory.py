"""Before launch: the trainer's planned memory per rank against each node's memory.

The plan is auralm.planning.sizing's estimate (asked of the launch's plan process, planner.py, while the nodes are
probed: the model on the meta device, nothing allocated): weights, gradients and optimizer states, plus the
activations of one micro-batch, linear in its rows. A node's memory is what its probe reported: the smallest GPU's
on a GPU node (a GPU a rank), else the RAM available (or its memory cgroup's, when less) shared by its ranks.

A rank whose estimate is above its share is refused before anything starts, in one line naming the node, the two
figures and the override that fits: the largest micro-batch within the trainer's margin
(auralm.planning.autobatch.MARGIN)
with gradient accumulation keeping the rows a step (``config.split_global_batch``, as batch_size=auto plans), and
what ``training.batch_size=auto`` would take. The estimate is within a factor of about 1.5 of what was measured;
``HRMCTL_MEMORY_CHECK=0`` launches anyway (and says so).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from auralm.training.config import split_global_batch
from cli.errors import HrmctlError
from cli.launch.plan import planner
from cli.launch.plan.options import TRAINER
from cli.launch.plan.plan import NodeFacts

GIB = 1 << 30
SKIP_ENV = "HRMCTL_MEMORY_CHECK"  # "0": no refusal (the estimate is a rough one)
SIZING_TIMEOUT_S = 120
SIZING_CACHE_NAME = "model-sizes.json"  # in hrmctl's cache directory (cli/cache.py)


def model_size(opts, world: int, vocab: int | None = None) -> dict | None:
    """The trainer's model: parameters and a per-rank memory estimate (auralm.planning.sizing, asked of the plan
    process: on the meta device, nothing allocated), at the data's vocabulary when given (else the model's, or
    32000 for text); cached by _sizing_key. None for another module, or when it cannot say."""
    if opts.module != TRAINER:
        return None
    from cli.cache import cache_dir, load as load_cache, save as save_cache

    cache = cache_dir() / SIZING_CACHE_NAME
    key = _sizing_key(opts.trainer, world, vocab)
    known = load_cache(cache).get(key) if key else None
    if known is not None:  # the same trainer source, Python and what the estimate reads: the same estimate
        return known
    answer = planner.ask("size", SIZING_TIMEOUT_S, args=list(opts.args), world=world, vocab=vocab)
    size = answer.result()
    if size is None:
        raise HrmctlError(answer.error or f"the model's size could not be computed within {SIZING_TIMEOUT_S} s here")
    if key:
        cached = load_cache(cache)
        cached[key] = size
        save_cache(cache, dict(list(cached.items())[-100:]))
    return size


def _sizing_key(cfg, world: int, vocab: int | None) -> str | None:
    """What the estimate reads of the trainer's config (``cfg``, LaunchOptions.trainer; auralm.planning.sizing.inputs:
    not the steps, intervals, paths or rates, so a run that changes only those reuses it) and the world, under the
    trainer's source (overrides.trainer_key). None when the overrides do not parse (the estimate's own process then
    says why)."""
    from auralm.planning.sizing import inputs
    from cli.launch.plan.overrides import trainer_key

    if cfg is None:
        return None
    try:
        read = inputs(cfg, vocab)
    except (ValueError, TypeError, KeyError):
        return None
    return trainer_key("model size", world, read)


@dataclass
class Share:
    """One node's memory for each of its ranks, as its probe reported it."""

    node: str
    gib: float  # the memory of one rank: a GPU's, or the node's available RAM / its ranks
    what: str  # "24 GiB GPU memory", "22.0 GiB RAM available for 2 ranks"


def shares(plans: list[tuple[str, int]], facts: dict[str, NodeFacts]) -> list[Share]:
    """plans: (node, its ranks) in launch order; a node whose memory the probe did not give is left out."""
    out = []
    for name, ranks in plans:
        f = facts.get(name)
        if f is None:
            continue
        if f.gpus and f.gpu_memory_gb:
            out.append(Share(name, f.gpu_memory_gb, f"{f.gpu_memory_gb:.1f} GiB GPU memory"))
        elif not f.gpus and f.mem_available_gb:
            ranks_note = f" for {ranks} ranks" if ranks > 1 else ""
            out.append(Share(name, f.mem_available_gb / ranks, f"{f.mem_available_gb:.1f} GiB RAM available{ranks_note}"))
    return out


def rank_batch(size: dict, world: int) -> int | None:
    """The micro-batch of a rank in a world of ``world`` (global_batch_size split as the trainer splits it,
    auralm.planning.sizing.per_rank), from the estimate made for one rank; None for batch_size=auto."""
    if size["batch_size"] == "auto":
        return None
    if size.get("global_batch_size"):
        return max(1, size["global_batch_size"] // (size["grad_accum"] * world))
    return size["batch_size"]


def verdict(size: dict, world: int, node_shares: list[Share], fsdp: bool = False) -> str | None:
    """None when every rank's estimate fits its node's share, else the refusal line for the first that does not."""
    states = size["states_bytes"] / (world if fsdp else 1)  # FSDP shards weights, gradients and moments
    per_row, margin = max(1, size["activation_bytes_per_row"]), size["memory_margin"]
    batch, accum = rank_batch(size, world), size.get("grad_accum") or 1
    for share in node_shares:
        room = share.gib * GIB
        need = states + (batch or 0) * per_row
        if need <= room:
            continue
        fits = int((margin * room - states) // per_row)
        head = (f"{share.node}: model {size['name']} " + (f"at training.batch_size={batch} " if batch else "") +
                f"needs about {need / GIB:.2f} GiB a rank ({states / GIB:.2f} weights, gradients and optimizer states"
                + (f", {batch * per_row / GIB:.2f} activations" if batch else "") + f"); {share.node} has {share.what}")
        if fits < 1:
            return (f"{head}: not even one row fits; fix: a smaller model"
                    + ("" if fsdp else " or training.parallel=fsdp over more ranks") + ", or a node with more memory")
        if batch is None:
            continue  # batch_size=auto: each rank measures and takes what fits
        new_batch, new_accum = split_global_batch(fits, world, batch * accum * world, accum)
        keys = (f"training.grad_accum={new_accum}" if size.get("global_batch_size") else
                f"training.batch_size={new_batch} training.grad_accum={new_accum}")
        fitted = (states + new_batch * per_row) / GIB
        return (f"{head}; fix: {keys} (the same {batch * accum * world} rows a step, about {fitted:.2f} GiB a "
                f"rank), or training.batch_size=auto (about {fits} rows a rank fit {margin:.0%} of it; measured at "
                f"start)")
    return None


def check(opts, size: dict | None, vocab: int | None, world: int, node_shares: list[Share], say) -> dict | None:
    """Raise the refusal (exit 1) unless the plan fits; with HRMCTL_MEMORY_CHECK=0 only ``say`` it. ``size`` was
    estimated beside the probes, before the data's vocabulary was known: a refusal is judged again at ``vocab``
    (the logits of a 512-token vocabulary are a sixteenth of 32000's). The estimate judged is returned."""

    def judge(size: dict | None) -> str | None:
        return verdict(size, world, node_shares, bool(size.get("shards_states"))) if size else None

    line = judge(size)
    if line and vocab and size.get("vocab") != vocab:
        size = model_size(opts, 1, vocab)
        line = judge(size)
    if not line:
        return size
    if os.environ.get(SKIP_ENV) != "0":
        raise HrmctlError(f"{line} (the estimate is rough: {SKIP_ENV}=0 launches anyway)", exit_code=1)
    say(f"warning: {line} (launching anyway: {SKIP_ENV}=0)")
    return size
