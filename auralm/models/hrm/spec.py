"""HRM's declaration: what its model reads (``HRMArgs``), its sizes, builder, checks and costs, registered as the
family ``hrm``."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

from auralm.errors import UserError
from auralm.models import recurrent, registry
from auralm.models.registry import ModelFamily, register



@dataclass(frozen=True, kw_only=True)
class HRMArgs(recurrent.RecurrentArgs):
    """HRM's model: the recurrent keys, and its slow level H's layers."""

    family: ClassVar[str] = "hrm"
    H_layers: int


SIZES = {
    # trains on a CPU in minutes: pre-norm (learns faster here), 2 segments in training, 8 at evaluation
    # (pos_encodings=auto: the sudoku positions and relations on sudoku, rotary on text)
    "hrm-tiny": HRMArgs(n_embd=128, n_head=4, H_layers=2, L_layers=2, H_cycles=2, L_cycles=2,
                        halt_max_steps=2, eval_segments=8, pos_encodings="auto", norm="pre", block_size=128),
    # the paper's Sudoku / ARC model: about 27M parameters
    "hrm-27m": HRMArgs(n_embd=512, n_head=8, H_layers=4, L_layers=4, H_cycles=2, L_cycles=2,
                       halt_max_steps=16, puzzle_emb_ndim=512, block_size=512, loss_type="stablemax"),
    # the language-model sizes (counts with a 32k vocabulary, untied input and output embeddings)
    "hrm-50m": HRMArgs(n_embd=512, n_head=8, H_layers=3, L_layers=3, H_cycles=2, L_cycles=2,
                       halt_max_steps=4, block_size=1024),
    "hrm-100m": HRMArgs(n_embd=768, n_head=12, H_layers=4, L_layers=4, H_cycles=2, L_cycles=2,
                        halt_max_steps=4, block_size=1024),
}


def check(task: str, name: str, arch: HRMArgs) -> None:
    registry.check_width(arch)
    if arch.H_layers <= 0:
        raise UserError(f"model.H_layers={arch.H_layers}: must be greater than 0")
    recurrent.check_values(task, name, arch)


def blocks_in_graph(arch: HRMArgs) -> int:
    """Only the last L and the last H update of a segment are in the graph."""
    return arch.H_layers + arch.L_layers


def passes(arch: HRMArgs) -> float:
    """L layers H_cycles x L_cycles times and H layers H_cycles times a segment, the last of each in the graph."""
    L, H = arch.L_layers, arch.H_layers
    forward = arch.H_cycles * (arch.L_cycles * L + H) / (L + H)
    return (forward + 2) / 3


FAMILY = register(ModelFamily(
    name="hrm", title="HRM", args=HRMArgs, sizes=SIZES, build=partial(recurrent.build, "auralm.models.hrm.model"),
    model_class=recurrent.act_class, tasks=recurrent.TASKS, select="model=hrm-tiny (or arch=hrm_v1)", smallest="hrm-tiny",
    positive=recurrent.POSITIVE, check=check, blocks_in_graph=blocks_in_graph,
    passes=passes,
    # the language-model sizes (C4, the GPT-2 tokenizer): text unless task= says otherwise
    size_task={"hrm-50m": "lm", "hrm-100m": "lm"}))
