"""TRM, the Tiny Recursive Model ("Less is More: Recursive Reasoning with Tiny Networks", 2025).

One small network recurses on the answer y and a latent z: ``L_cycles`` (n) updates of z from
z with y + the input embedding injected, then one update of y from y with z injected; that is one
of ``H_cycles`` (T) cycles. All cycles but the last run without gradient; the last one is
back-propagated through whole. ``mlp_t`` mixes across the positions with an MLP instead of
attention (the paper's Sudoku variant). Halting is on q_halt > 0 alone (no Q-continue target).
"""

from __future__ import annotations

import torch

from auralm.models.act import ACT, Level, RecurrentCore
from auralm.models.args import ModelArgs


class TRMCore(RecurrentCore):
    def __init__(self, arch: ModelArgs, vocab: int, n_out: int, seq_len: int, causal: bool):
        super().__init__(arch, vocab, n_out, seq_len, causal)
        self.T, self.n = arch.H_cycles, arch.L_cycles
        if arch.mlp_t and causal:
            raise ValueError("mlp_t mixes every position with every other: not for a causal (lm) model")
        self.net = Level(arch.L_layers, arch.n_embd, arch.n_head, arch.expansion, causal,
                         mlp_t_len=seq_len + self.n_prefix if arch.mlp_t else 0,
                         pre_norm=arch.norm == "pre")

    def cycle(self, y, z, emb, pos):
        for _ in range(self.n):
            z = self.net(z, y + emb, **pos)
        return self.net(y, z, **pos), z

    def reason(self, z, emb, pos):
        y, z = z
        with torch.no_grad():
            for _ in range(self.T - 1):
                y, z = self.cycle(y, z, emb, pos)
        return self.cycle(y, z, emb, pos)


def build(arch: ModelArgs, vocab: int, n_out: int, seq_len: int, causal: bool) -> ACT:
    return ACT(TRMCore(arch, vocab, n_out, seq_len, causal), arch, q_continue=False)
