"""TRM's declaration: what its model reads (``TRMArgs``), its sizes, builder, checks and costs, registered as the
family ``trm``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from auralm.models import recurrent, registry
from auralm.models.registry import ModelFamily, register



@dataclass(frozen=True, kw_only=True)
class TRMArgs(recurrent.RecurrentArgs):
    """TRM's model: the recurrent keys (one net, L_layers deep, run T = H_cycles times n = L_cycles), and whether it
    mixes the positions with an MLP instead of attention."""

    family: ClassVar[str] = "trm"
    mlp_t: bool = False


SIZES = {
    "trm-tiny": TRMArgs(n_embd=128, n_head=4, L_layers=2, H_cycles=2, L_cycles=3,
                        halt_max_steps=2, eval_segments=8, pos_encodings="auto", norm="pre", block_size=128),
    # the paper's Sudoku-Extreme model: MLP mixing over the positions, no position encoding, T=3, n=6
    "trm-5m-mlp": TRMArgs(n_embd=512, n_head=8, L_layers=2, H_cycles=3, L_cycles=6, halt_max_steps=16,
                          puzzle_emb_ndim=512, pos_encodings="none", mlp_t=True, block_size=512, loss_type="stablemax"),
    # the paper's attention variant (about 7M parameters)
    "trm-7m": TRMArgs(n_embd=512, n_head=8, L_layers=2, H_cycles=3, L_cycles=6,
                      halt_max_steps=16, puzzle_emb_ndim=512, block_size=512, loss_type="stablemax"),
}


def check(task: str, name: str, arch: TRMArgs) -> None:
    registry.check_width(arch)
    recurrent.check_values(task, name, arch, mlp_t=arch.mlp_t)


def blocks_in_graph(arch: TRMArgs) -> int:
    """The last cycle (L_cycles + 1 calls of the net) is in the graph."""
    return (arch.L_cycles + 1) * arch.L_layers


def passes(arch: TRMArgs) -> float:
    """The net H_cycles x (L_cycles + 1) times, the last cycle (L_cycles + 1 calls) in the graph."""
    return (arch.H_cycles * (arch.L_cycles + 1) + 2 * (arch.L_cycles + 1)) / 3


FAMILY = register(ModelFamily(
    name="trm", title="TRM", args=TRMArgs, sizes=SIZES, build=partial(recurrent.build, "auralm.models.trm.model"),
    model_class=recurrent.act_class, tasks=recurrent.TASKS, select="model=trm-tiny (or arch=trm)", smallest="trm-tiny",
    positive=recurrent.POSITIVE, check=check,
    blocks_in_graph=blocks_in_graph, passes=passes))
