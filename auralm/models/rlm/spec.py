"""The RLM's declaration: what its model reads (``RLMArgs``), its sizes (pre-norm RMSNorm, rotary positions, SwiGLU,
mHC with 4 streams), builder, checks and validate-model's mHC checks, registered as the family ``rlm``. A language
model only: model=rlm-* means task=lm unless task is given."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from auralm.errors import UserError
from auralm.models.args import ModelArgs
from auralm.models.registry import ModelFamily, check_result, register


@dataclass(frozen=True, kw_only=True)
class RLMArgs(ModelArgs):
    """The RLM's model: n_layer blocks of attention (n_head x head_dim) and a SwiGLU of ffn_dim, with mHC's
    streams unless mhc_enabled is false."""

    family: ClassVar[str] = "rlm"
    n_layer: int
    head_dim: int  # attention: heads x head_dim need not be the width
    ffn_dim: int  # SwiGLU's hidden width
    vocab_size: int | None = None  # None: the data's; larger pads the embeddings (the counts in docs/rlm.md: 32000)
    mhc_enabled: bool = True  # manifold-constrained hyper-connections (false: the plain transformer)
    mhc_flows: int = 4  # n, the parallel residual streams
    mhc_sinkhorn_iters: int = 20  # Sinkhorn-Knopp rounds projecting H_res onto the doubly stochastic matrices


TASKS = ("lm",)  # the tasks it trains: a language model
SIZES = {
    "rlm-tiny": RLMArgs(n_embd=256, n_layer=4, n_head=4, head_dim=64, ffn_dim=688, block_size=256),  # a CPU
    "rlm-small": RLMArgs(n_embd=768, n_layer=12, n_head=12, head_dim=64, ffn_dim=2048, block_size=1024),  # 125M
    "rlm-base": RLMArgs(n_embd=2048, n_layer=24, n_head=16, head_dim=128, ffn_dim=5504, block_size=2048),  # 1.3B
    "rlm-large": RLMArgs(n_embd=4096, n_layer=32, n_head=32, head_dim=128, ffn_dim=11008, block_size=2048),  # 7B
}
TOLERANCE = 1e-3  # validate-model: H_res's rows and columns at initialisation
COLUMN_TOLERANCE = 1e-5  # Sinkhorn ends by dividing each column by its sum: float32 leaves n * 2**-24 at most
AMAX_LIMIT = 2.0


def check(task: str, name: str, arch: RLMArgs) -> None:
    if task not in TASKS:
        raise UserError(f"model={name} is a language model: use it with task={' or task='.join(TASKS)}")
    if arch.vocab_size is not None and arch.vocab_size <= 0:
        raise UserError(f"model.vocab_size={arch.vocab_size}: must be greater than 0 (or unset: the data's)")
    if arch.head_dim % 2:
        raise UserError(f"model.head_dim={arch.head_dim}: rotary positions need an even head size")


def model_class(task: str, arch: RLMArgs) -> type:
    from auralm.models.rlm.model import RLMModel

    return RLMModel


def build(task: str, arch: RLMArgs, vocab: int | None):
    return model_class(task, arch)(arch, vocab)


def validate_checks(model, trained: bool) -> list[dict]:
    """validate-model's mHC checks: before training every H_res doubly stochastic and the composite mixing's
    amax below AMAX_LIMIT; after it every token's H_res of the last forward and the amax again."""
    connections = model.connections()
    if not connections:
        return []
    if trained:
        return [trained_stochastic(connections), amax(model, "amax after training")]
    worst = max(max(float((m.sum(0) - 1).abs().max()), float((m.sum(1) - 1).abs().max()))
                for m in (c.get_connection_matrix().double() for c in connections))
    return [check_result("doubly stochastic", worst < TOLERANCE,
                         f"{len(connections)} H_res matrices, rows and columns within {worst:.1e} of 1"),
            amax(model, "amax")]


def amax(model, name: str) -> dict:
    values = model.get_mhc_metrics()
    pre, post = max(a for a, _ in values), max(b for _, b in values)
    return check_result(name, max(pre, post) < AMAX_LIMIT, f"composite mixing: pre {pre:.4f}, post {post:.4f} "
                                                           f"(healthy below {AMAX_LIMIT})")


def trained_stochastic(connections: list) -> dict:
    """Every token's H_res of the last forward: what Sinkhorn at N rounds guarantees (columns summing to 1, its
    last step) is checked; the rows, which converge with the rounds and the logits' spread, are reported (their
    effect on the signal is the amax check)."""
    res = [c.last_res.double() for c in connections]
    cols = max(float((m.sum(-2) - 1).abs().max()) for m in res)
    rows = max(float((m.sum(-1) - 1).abs().max()) for m in res)
    iters = connections[0].iters
    return check_result("doubly stochastic after training",
                        cols < COLUMN_TOLERANCE and all(bool((m >= 0).all()) for m in res),
                        f"every token's H_res: columns within {cols:.1e} of 1, rows within {rows:.1e} after {iters} "
                        f"Sinkhorn rounds (more rounds: model.mhc_sinkhorn_iters=N)")


FAMILY = register(ModelFamily(
    name="rlm", title="RLM (mHC)", args=RLMArgs, sizes=SIZES, build=build, model_class=model_class, tasks=TASKS,
    select="model=rlm-tiny", smallest="rlm-tiny", positive=("head_dim", "ffn_dim", "mhc_flows", "mhc_sinkhorn_iters"),
    check=check, validates=True, validate_checks=validate_checks))
