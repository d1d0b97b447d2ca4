"""TRM's declaration: its sizes, builder, checks and costs, registered as the family ``trm``."""

from __future__ import annotations

from functools import partial

from auralm.models import recurrent
from auralm.models.registry import ModelFamily, register

_TRM = dict(recurrent.DEFAULTS, family="trm")
SIZES = {
    "trm-tiny": dict(_TRM, n_embd=128, n_head=4, H_layers=0, L_layers=2, H_cycles=2, L_cycles=3,
                     halt_max_steps=2, eval_segments=8, pos_encodings="auto", norm="pre", block_size=128),
    # the paper's Sudoku-Extreme model: MLP mixing over the positions, no position encoding, T=3, n=6
    "trm-5m-mlp": dict(_TRM, n_embd=512, n_head=8, H_layers=0, L_layers=2, H_cycles=3,
                       L_cycles=6, halt_max_steps=16, puzzle_emb_ndim=512, pos_encodings="none", mlp_t=True,
                       block_size=512, loss_type="stablemax"),
    # the paper's attention variant (about 7M parameters)
    "trm-7m": dict(_TRM, n_embd=512, n_head=8, H_layers=0, L_layers=2, H_cycles=3, L_cycles=6,
                   halt_max_steps=16, puzzle_emb_ndim=512, block_size=512, loss_type="stablemax"),
}


def blocks_in_graph(arch: dict) -> int:
    """The last cycle (L_cycles + 1 calls of the net) is in the graph."""
    return (arch["L_cycles"] + 1) * arch["L_layers"]


def passes(arch: dict) -> float:
    """The net H_cycles x (L_cycles + 1) times, the last cycle (L_cycles + 1 calls) in the graph."""
    return (arch["H_cycles"] * (arch["L_cycles"] + 1) + 2 * (arch["L_cycles"] + 1)) / 3


FAMILY = register(ModelFamily(
    name="trm", title="TRM", sizes=SIZES, build=partial(recurrent.build, "auralm.models.trm.model", "trm"),
    model_class=recurrent.act_class, tasks=recurrent.TASKS, select="model=trm-tiny (or arch=trm)", smallest="trm-tiny",
    unread=frozenset({"H_layers"}), positive=recurrent.POSITIVE, check=recurrent.check,
    blocks_in_graph=blocks_in_graph, passes=passes))
