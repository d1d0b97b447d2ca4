"""A small non-causal transformer over the 81 sudoku cells (the ``tiny``/``mini``/... sizes on ``task=sudoku``)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from auralm.models.layers import sudoku_positions, token_loss
from auralm.models.pretrained import Pretrained
from auralm.models.args import ModelArgs


class SudokuNet(nn.Module, Pretrained):
    """A non-causal transformer over the 81 cells that predicts every cell's digit.

    A cell's position is the sum of its row, column and box embeddings, so the model is told
    which cells constrain each other; with one learned embedding per cell it barely learns at
    this size in a few hundred steps.
    """

    def __init__(self, arch: ModelArgs):
        super().__init__()
        d = arch.n_embd
        self.cell = nn.Embedding(10, d)  # 0 = blank, 1..9 = given digit
        self.row, self.col, self.box = (nn.Parameter(torch.randn(9, d)) for _ in range(3))  # as nn.Embedding
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, arch.n_head, 4 * d, arch.dropout, activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(arch.n_layer))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 9)
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, on: bool) -> None:
        self.grad_checkpointing = on

    def forward(self, x, y=None):
        h = self.cell(x) + sudoku_positions(self.row, self.col, self.box)
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=False) if self.grad_checkpointing and self.training else layer(h)
        logits = self.head(self.norm(h))
        return logits, token_loss(logits, y)
