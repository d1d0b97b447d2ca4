"""GPT's declaration: the plain sizes (``PlainArgs``) (GPT-2 on task=lm; the sudoku transformer builds them on
task=sudoku), its builder and checks, registered as the family ``gpt``."""

from __future__ import annotations

from dataclasses import dataclass

from auralm.models import registry
from auralm.models.args import ModelArgs
from auralm.models.registry import ModelFamily, register


@dataclass(frozen=True, kw_only=True)
class PlainArgs(ModelArgs):
    """The plain sizes: a stack of n_layer transformer blocks (GPT on text, the sudoku transformer on a grid)."""

    n_layer: int


SIZES = {
    "tiny": PlainArgs(n_layer=2, n_head=2, n_embd=64, block_size=64),
    "mini": PlainArgs(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "small": PlainArgs(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "124m": PlainArgs(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}


def check_width(task: str, name: str, arch: PlainArgs) -> None:
    registry.check_width(arch)


def model_class(task: str, arch: PlainArgs) -> type:
    from auralm.models.gpt.model import GPT

    return GPT


def build(task: str, arch: PlainArgs, vocab: int | None):
    return model_class(task, arch)(arch, vocab)


FAMILY = register(ModelFamily(
    name="gpt", title="GPT (GPT-2 on task=lm, the sudoku transformer on task=sudoku)", args=PlainArgs, sizes=SIZES,
    build=build,
    model_class=model_class, tasks=("lm",), plain=True, select="model=tiny", smallest="tiny", check=check_width,
    validates=True))
