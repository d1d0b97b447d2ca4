"""The models: a GPT-2-style causal LM (``transformers``) for ``lm``, a small non-causal transformer for ``sudoku``.

Both take ``(x, y)`` and return ``(logits, loss)``; ``y`` uses -100 for positions without a target.
Attention goes through PyTorch's scaled_dot_product_attention in both.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _loss(logits: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor | None:
    if y is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), ignore_index=-100)


class GPT(nn.Module):
    """transformers' GPT2LMHeadModel, initialised from a config (no pretrained weights), SDPA attention.

    ``gelu_pytorch_tanh`` is PyTorch's fused tanh-GELU: the same function as GPT-2's ``gelu_new``,
    about a quarter faster on CPU.
    """

    def __init__(self, arch: dict, vocab_size: int):
        from transformers import GPT2Config, GPT2LMHeadModel  # importing transformers takes seconds: lm only

        cfg = GPT2Config(vocab_size=vocab_size, n_positions=arch["block_size"], n_embd=arch["n_embd"],
                         n_layer=arch["n_layer"], n_head=arch["n_head"], activation_function="gelu_pytorch_tanh",
                         resid_pdrop=arch["dropout"], embd_pdrop=arch["dropout"], attn_pdrop=arch["dropout"],
                         bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
        cfg._attn_implementation = "sdpa"
        super().__init__()
        self.hf = GPT2LMHeadModel(cfg)

    def set_grad_checkpointing(self, on: bool) -> None:
        if on and hasattr(self.hf, "activation_checkpointing_enable"):  # transformers >= 5.x
            self.hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        elif on:
            self.hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def forward(self, x, y=None):
        logits = self.hf(input_ids=x, use_cache=False).logits
        return logits, _loss(logits, y)

    @torch.no_grad()
    def generate(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """Greedy continuation by ``n`` tokens (no sampling: it leaves the RNG alone)."""
        block = self.hf.config.n_positions
        for _ in range(n):
            logits = self.hf(input_ids=x[:, -block:], use_cache=False).logits
            x = torch.cat([x, logits[:, -1:].argmax(-1)], dim=1)
        return x


class SudokuNet(nn.Module):
    """A non-causal transformer over the 81 cells that predicts every cell's digit.

    A cell's position is the sum of its row, column and box embeddings, so the model is told
    which cells constrain each other; with one learned embedding per cell it barely learns at
    this size in a few hundred steps.
    """

    def __init__(self, arch: dict):
        super().__init__()
        d = arch["n_embd"]
        self.cell = nn.Embedding(10, d)  # 0 = blank, 1..9 = given digit
        self.row, self.col, self.box = (nn.Parameter(torch.randn(9, d)) for _ in range(3))  # as nn.Embedding
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d, arch["n_head"], 4 * d, arch["dropout"], activation="gelu",
                                       batch_first=True, norm_first=True)
            for _ in range(arch["n_layer"]))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 9)
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, on: bool) -> None:
        self.grad_checkpointing = on

    def forward(self, x, y=None):
        d = self.row.shape[1]
        # cell i = 9 * row + col; its box is 3 * (row // 3) + col // 3 (no index buffer: DDP would sync it every step)
        where = (self.row.repeat_interleave(9, dim=0) + self.col.repeat(9, 1)
                 + self.box.view(3, 1, 3, 1, d).expand(3, 3, 3, 3, d).reshape(81, d))
        h = self.cell(x) + where
        for layer in self.layers:
            h = checkpoint(layer, h, use_reentrant=False) if self.grad_checkpointing and self.training else layer(h)
        logits = self.head(self.norm(h))
        return logits, _loss(logits, y)


def build(task: str, arch: dict, vocab_size: int | None = None) -> nn.Module:
    return SudokuNet(arch) if task == "sudoku" else GPT(arch, vocab_size)
