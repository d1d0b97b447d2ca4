"""HRM, the Hierarchical Reasoning Model (Wang et al., 2025): a slow module H and a fast module L.

One segment is ``H_cycles`` x ``L_cycles`` updates of L and ``H_cycles`` updates of H. L is updated
from z_L with z_H + the input embedding injected; H from z_H with z_L injected. Every update but
the last L and the last H runs without gradient (the one-step gradient approximation). Trained
and evaluated through :class:`auralm.models.act.ACT`.
"""

from __future__ import annotations

import torch

from auralm.models.act import ACT, Level, RecurrentCore
from auralm.models.args import ModelArgs


class HRMCore(RecurrentCore):
    def __init__(self, arch: ModelArgs, vocab: int, n_out: int, seq_len: int, causal: bool):
        super().__init__(arch, vocab, n_out, seq_len, causal)
        d, heads, exp = arch.n_embd, arch.n_head, arch.expansion
        self.H_cycles, self.L_cycles = arch.H_cycles, arch.L_cycles
        pre = arch.norm == "pre"
        self.H = Level(arch.H_layers, d, heads, exp, causal, pre_norm=pre)
        self.L = Level(arch.L_layers, d, heads, exp, causal, pre_norm=pre)

    def reason(self, z, emb, pos):
        z_H, z_L = z
        with torch.no_grad():
            for h in range(self.H_cycles):
                for i in range(self.L_cycles):
                    if h < self.H_cycles - 1 or i < self.L_cycles - 1:
                        z_L = self.L(z_L, z_H + emb, **pos)
                if h < self.H_cycles - 1:
                    z_H = self.H(z_H, z_L, **pos)
        z_L = self.L(z_L, z_H + emb, **pos)  # the one step with gradient
        z_H = self.H(z_H, z_L, **pos)
        return z_H, z_L


def build(arch: ModelArgs, vocab: int, n_out: int, seq_len: int, causal: bool) -> ACT:
    return ACT(HRMCore(arch, vocab, n_out, seq_len, causal), arch, q_continue=True)
