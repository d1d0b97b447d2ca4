"""The sudoku transformer's declaration: GPT's plain sizes on task=sudoku, registered as the family
``transformer``."""

from __future__ import annotations

from auralm.models.gpt.spec import SIZES, PlainArgs, check_width
from auralm.models.registry import ModelFamily, register


def model_class(task: str, arch: PlainArgs) -> type:
    from auralm.models.transformer.model import SudokuNet

    return SudokuNet


def build(task: str, arch: PlainArgs, vocab: int | None):
    return model_class(task, arch)(arch)


FAMILY = register(ModelFamily(
    name="transformer", title="the sudoku transformer", args=PlainArgs, sizes=SIZES, build=build,
    model_class=model_class,
    tasks=("sudoku",), plain=True, select="model=tiny task=sudoku", smallest="tiny", check=check_width))
