"""GPT-2 for ``task=lm``: takes ``(x, y)`` and returns ``(logits, loss)``; ``y`` is -100 where there is no target.

``step(ids, cache)`` runs new tokens against a KV cache (``new_cache()``) for generation (``auralm.tools.generate``),
the protocol of ``auralm.models.rlm``; the training forward does not use it.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from auralm.models.chunked_loss import linear_cross_entropy
from auralm.models.layers import token_loss
from auralm.models.rlm.model import KVCache
from auralm.models.pretrained import Pretrained
from auralm.models.args import ModelArgs


class Block(nn.Module):
    """GPT-2's block: pre-norm causal self-attention and a tanh-GELU MLP, each added to the residual."""

    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv, self.attn_proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.fc, self.mlp_proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        B, T, C = h.shape
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.qkv(self.ln_1(h)).split(C, dim=2))
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        h = h + self.drop(self.attn_proj(a.transpose(1, 2).reshape(B, T, C)))
        return h + self.drop(self.mlp_proj(F.gelu(self.fc(self.ln_2(h)), approximate="tanh")))

    def cached(self, h: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
        """``forward`` for new tokens after those in ``cache`` (eval: no dropout); their keys and values join it."""
        B, T, C = h.shape
        start = cache.length
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.qkv(self.ln_1(h)).split(C, dim=2))
        if cache.layers[layer] is not None:
            k = torch.cat([cache.layers[layer][0], k], dim=2)
            v = torch.cat([cache.layers[layer][1], v], dim=2)
        cache.layers[layer] = (k, v)
        if start and T > 1:  # each new token sees the cache and the new ones before it
            mask = torch.ones(T, start + T, dtype=torch.bool, device=h.device).tril(diagonal=start)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        h = h + self.attn_proj(a.transpose(1, 2).reshape(B, T, C))
        return h + self.mlp_proj(F.gelu(self.fc(self.ln_2(h)), approximate="tanh"))


class GPT(nn.Module, Pretrained):
    """GPT-2 (learned positions, pre-norm blocks, tanh-GELU, tied input and output embeddings), GPT-2's init.

    Our own module rather than ``transformers``' GPT2LMHeadModel: the same function, measurably
    faster (``bench/train_throughput.py``), mostly because the loss is taken a chunk of tokens at
    a time (``auralm.models.chunked_loss``) instead of over the whole ``(tokens, vocab)`` logits; in
    training the forward returns no logits.
    """

    def __init__(self, arch: ModelArgs, vocab_size: int):
        super().__init__()
        d, self.block_size = arch.n_embd, arch.block_size
        self.wte, self.wpe = nn.Embedding(vocab_size, d), nn.Embedding(arch.block_size, d)
        self.drop = nn.Dropout(arch.dropout) if arch.dropout else nn.Identity()
        self.blocks = nn.ModuleList(Block(d, arch.n_head, arch.dropout) for _ in range(arch.n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.grad_checkpointing = False
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:  # the projections into the residual stream are scaled down with depth
                std = 0.02 / math.sqrt(2 * arch.n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def set_grad_checkpointing(self, on: bool) -> None:
        self.grad_checkpointing = on

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device)))
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False) if self.grad_checkpointing and self.training else block(h)
        return self.ln_f(h)

    def forward(self, x, y=None):
        h = self.hidden(x)
        if y is not None and torch.is_grad_enabled():
            return None, linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.wte.weight, y.reshape(-1))
        logits = F.linear(h, self.wte.weight)
        return logits, token_loss(logits, y)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.blocks))

    def step(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (B, T, vocab) of ``ids`` following the tokens already in ``cache`` (which they join); the
        positions go on from ``cache.length`` and must stay below ``block_size`` (learned positions)."""
        start, T = cache.length, ids.shape[1]
        if start + T > self.block_size:
            raise ValueError(f"{start} cached + {T} new tokens pass block_size={self.block_size}: start a new cache")
        h = self.wte(ids) + self.wpe(torch.arange(start, start + T, device=ids.device))
        for i, block in enumerate(self.blocks):
            h = block.cached(h, cache, i)
        cache.length += T
        return F.linear(self.ln_f(h), self.wte.weight)
