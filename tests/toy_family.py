"""A toy model family registered from outside auralm, the way a family of your own is added (docs/trainer.md, "Adding a
model family"): one ModelFamily with what its model reads (a ModelArgs dataclass), its sizes, builder, checks and
costs, and one register() call. No folder under auralm/models/: ``AURALM_MODEL_PLUGINS=tests.toy_family`` makes
every process that reads a config (hrmctl's preflight, the trainer under torchrun, the tools) import it.
tests/trainer/test_toy_family.py trains it.

The model: each sudoku cell's value and position embedded, ``n_layer`` residual MLPs applied to every cell on its own
(no attention: a cell never sees another), a head over the 9 digits."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import ClassVar

from auralm.errors import UserError
from auralm.models.args import ModelArgs
from auralm.models.registry import ModelFamily, register


@dataclass(frozen=True, kw_only=True)
class ToyArgs(ModelArgs):
    """What the toy reads: its width and its MLPs (n_head and block_size as every family has them)."""

    family: ClassVar[str] = "toy"
    n_layer: int


SIZES = {"toy-tiny": ToyArgs(n_layer=1, n_head=1, n_embd=32, block_size=81)}


@cache
def _toy_class() -> type:
    """The model's class, made when first asked for: importing this module imports no torch (auralm.training.config's
    check
    of the keys runs without it)."""
    import torch.nn as nn

    from auralm.models.layers import token_loss
    from auralm.models.pretrained import Pretrained

    class ToyMLP(nn.Module, Pretrained):
        def __init__(self, arch: ToyArgs):
            super().__init__()
            d = arch.n_embd
            self.cell, self.pos = nn.Embedding(10, d), nn.Embedding(81, d)
            self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(),
                                                      nn.Linear(4 * d, d)) for _ in range(arch.n_layer))
            self.head = nn.Linear(d, 9)

        def set_grad_checkpointing(self, on: bool) -> None:
            pass  # the trainer's training.grad_checkpoint: nothing worth recomputing here

        def forward(self, x, y=None):
            import torch

            h = self.cell(x) + self.pos(torch.arange(x.shape[1], device=x.device))
            for layer in self.layers:
                h = h + layer(h)
            logits = self.head(h)
            return logits, token_loss(logits, y)

    return ToyMLP


def model_class(task: str, arch: ToyArgs) -> type:
    return _toy_class()


def build(task: str, arch: ToyArgs, vocab: int | None):
    return model_class(task, arch)(arch)


def check(task: str, name: str, arch: ToyArgs) -> None:
    if arch.block_size != 81:
        raise UserError(f"model.block_size={arch.block_size}: {name} sees the 81 cells of a sudoku")


FAMILY = register(ModelFamily(name="toy", title="Toy (an MLP per cell)", args=ToyArgs, sizes=SIZES, build=build,
                              model_class=model_class, tasks=("sudoku",), select="model=toy-tiny",
                              check=check))
