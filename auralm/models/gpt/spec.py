"""GPT's declaration: the plain sizes (GPT-2 on task=lm; the sudoku transformer builds them on task=sudoku), its
builder and checks, registered as the family ``gpt``."""

from __future__ import annotations

from auralm.models import registry
from auralm.models.registry import ModelFamily, register

SIZES = {
    "tiny": dict(n_layer=2, n_head=2, n_embd=64, block_size=64),
    "mini": dict(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "124m": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}


def check_width(task: str, name: str, arch: dict) -> None:
    registry.check_width(arch)


def model_class(task: str, arch: dict) -> type:
    from auralm.models.gpt.model import GPT

    return GPT


def build(task: str, arch: dict, vocab: int | None):
    return model_class(task, arch)(arch, vocab)


FAMILY = register(ModelFamily(
    name="gpt", title="GPT (GPT-2 on task=lm, the sudoku transformer on task=sudoku)", sizes=SIZES, build=build,
    model_class=model_class, tasks=("lm",), plain=True, select="model=tiny", smallest="tiny", check=check_width,
    validates=True))
