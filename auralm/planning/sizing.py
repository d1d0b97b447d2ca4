"""What a model costs before it runs: parameters (counted on the meta device, nothing allocated) and a
per-rank memory estimate, for ``hrmctl train --dry-run``: ``python -m auralm.planning.sizing [key=value ...]``.

The estimate: weights, gradients and AdamW's two moments in fp32 (16 bytes a parameter, 4 more with an
EMA), plus the activations autograd keeps for one micro-batch: per block in the graph about
``(10 d + 3 w) x tokens`` values (qkv, attention out, residuals and norms; the SwiGLU's gate, up and
product of width ``w``), with mHC ``8 n d x tokens`` more (each of two connections keeps its n streams
four times: in, normalised, mixed, out) and ``heads x T x T`` attention weights when the attention is not fused.
For HRM only the last L and H updates are in the graph, for TRM the last cycle (``L_cycles + 1``
net calls), so it does not grow with the cycles. A rough figure (within a factor of about 1.5 of
what was measured on the CPU), to tell a model that fits from one that does not.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from auralm import models, tasks
from auralm.training import config
from auralm.errors import UserError, exit_frozen
from auralm.models import registry
from auralm.parallel import strategy
from auralm.models.args import ModelArgs

if TYPE_CHECKING:
    import torch


def meta_model(task: str, arch: ModelArgs, vocab: int | None) -> torch.nn.Module:
    """The model built on the meta device: shapes, no memory, no initialisation (registry.on_meta)."""
    with registry.on_meta():
        return models.build(task, arch, vocab)


def parameter_shapes(task: str, arch: ModelArgs, vocab: int | None) -> list[tuple[int, ...]]:
    """The shape of every trainable parameter, in the model's order (a tied weight once): what DDP all-reduces
    (what the model's family says a step sends, auralm.models.registry)."""
    return registry.of(task, arch).sent_shapes(task, arch, vocab)


def count_parameters(task: str, arch: ModelArgs, vocab: int | None) -> int:
    return sum(p.numel() for p in meta_model(task, arch, vocab).parameters())


def blocks_in_graph(task: str, arch: ModelArgs) -> int:
    """The blocks whose activations autograd keeps for one step, as the model's family declares it."""
    return registry.of(task, arch).blocks_in_graph(arch)


def inputs(cfg: config.Config, vocab: int | None = None) -> dict:
    """All that estimate() and summary() read of a config: what the launcher keys its cache of estimates by
    (cli/launch/plan/memory.py), so that overrides which change nothing here (steps, intervals, paths, rates) reuse an
    estimate. Cheap: no torch."""
    t = cfg.training
    return {"task": cfg.task, "name": cfg.model.name, "arch": config.resolved_model(cfg.model).to_dict(),
            "vocab": vocab,
            "batch_size": t.batch_size, "grad_checkpoint": bool(t.grad_checkpoint), "ema": bool(t.ema),
            "grad_accum": t.grad_accum, "global_batch_size": t.global_batch_size, "parallel": t.parallel,
            "sync": t.sync}


def estimate(cfg: config.Config, vocab: int | None = None) -> dict:
    """Parameters and per-rank bytes: {"parameters", "states_bytes", "activation_bytes", "total_bytes"}, from
    inputs(cfg, vocab) alone."""
    from auralm.models.layers import swiglu_width

    given = inputs(cfg, vocab)
    task, arch, batch_size = given["task"], config.resolved_model(cfg.model), given["batch_size"]
    spec = tasks.get(task)
    vocab = given["vocab"] or spec.default_vocab
    n = count_parameters(task, arch, vocab)
    d, heads = arch.n_embd, arch.n_head
    T = spec.positions(arch)
    width = getattr(arch, "ffn_dim", 0) or swiglu_width(d, getattr(arch, "expansion", 4 * 1.5))
    out_classes = spec.classes(vocab)

    def activations(batch: int) -> int:
        tokens = batch * T
        per_block = (10 * d + 3 * width) * tokens + heads * T * T * batch
        if getattr(arch, "mhc_enabled", False):  # two connections a block: the n streams in, mixed and out, normalised
            per_block += 2 * 4 * arch.mhc_flows * d * tokens
        if given["grad_checkpoint"]:
            return 4 * (blocks_in_graph(task, arch) * d * tokens + per_block + 2 * tokens * out_classes)
        return 4 * (blocks_in_graph(task, arch) * per_block + 2 * tokens * out_classes)

    auto = batch_size == config.AUTO
    act = 0 if auto else activations(batch_size)
    states = n * (16 + (4 if given["ema"] else 0))
    return {"name": given["name"], "parameters": n, "batch_size": "auto" if auto else batch_size,
            "states_bytes": states, "activation_bytes": act, "total_bytes": states + act,
            "activation_bytes_per_row": activations(1)}


def describe(cfg: config.Config, vocab: int | None = None) -> str:
    e = estimate(cfg, vocab)
    gb = 1 << 30
    if e["batch_size"] == "auto":
        return (f"model {cfg.model.name}: {e['parameters'] / 1e6:.2f}M parameters; per rank about "
                f"{e['states_bytes'] / gb:.2f} GiB of weights, gradients and optimizer, and "
                f"{e['activation_bytes_per_row'] / 2**20:.1f} MiB of activations a row (batch_size=auto)")
    return (f"model {cfg.model.name}: {e['parameters'] / 1e6:.2f}M parameters; per rank about "
            f"{e['total_bytes'] / gb:.2f} GiB ({e['states_bytes'] / gb:.2f} weights, gradients and optimizer; "
            f"{e['activation_bytes'] / gb:.2f} activations at batch {cfg.training.batch_size})")


def per_rank(cfg: config.Config, world: int) -> None:
    """``global_batch_size`` as this world's batch per rank (as the trainer resolves it at start)."""
    t = cfg.training
    if t.global_batch_size and t.batch_size != config.AUTO:
        t.batch_size = max(1, t.global_batch_size // (t.grad_accum * world))


def summary(cfg: config.Config, world: int = 1, vocab: int | None = None) -> dict:
    """``--json``'s document: the estimate for one rank of a world of ``world``, with what the launcher's memory
    check needs beside it; from inputs(cfg, vocab) and ``world`` alone."""
    from auralm.planning.autobatch import MARGIN  # the share of memory batch_size=auto plans with, for the dry run

    per_rank(cfg, world)
    given = inputs(cfg, vocab or given_vocab(cfg))
    vocab = given["vocab"] or tasks.get(given["task"]).default_vocab
    return dict(estimate(cfg, given["vocab"]), grad_accum=given["grad_accum"],
                global_batch_size=given["global_batch_size"], memory_margin=MARGIN, parallel=given["parallel"],
                vocab=vocab, shards_states=strategy.strategy_class(given["sync"], given["parallel"]).shards_states)


def given_vocab(cfg: config.Config) -> int | None:
    """The model's own vocabulary, when its config names one."""
    return getattr(config.resolved_model(cfg.model), "vocab_size", None)


def document(args: list[str], world: int = 1, vocab: int | None = None) -> dict:
    """summary() of the config a command line gives: what ``--json`` prints, and the plan process's "size"
    (auralm.planning.server)."""
    from auralm.training import command_line

    cfg, _ = command_line.parse_command_line(args)
    return summary(cfg, world, vocab)


if __name__ == "__main__":
    # python -m auralm.planning.sizing [--json] [--world N] [--vocab N] key=value ...  (--vocab: the data's vocabulary)
    try:
        args, opts = sys.argv[1:], {"--world": 1, "--vocab": None}
        for flag in opts:
            if flag in args:
                i = args.index(flag)
                opts[flag] = int(args[i + 1])
                del args[i: i + 2]
        args = [a for a in args if a != "--json"]
        if "--json" in sys.argv:
            import json

            print(json.dumps(document(args, opts["--world"], opts["--vocab"])))
        else:
            from auralm.training import command_line

            cfg, _ = command_line.parse_command_line(args)
            per_rank(cfg, opts["--world"])
            print(describe(cfg, opts["--vocab"] or given_vocab(cfg)))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        exit_frozen(2)
    exit_frozen(0)
