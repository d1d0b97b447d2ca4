"""RLM: the RLM-mHC guide's transformer for ``task=lm``: pre-norm RMSNorm, rotary positions, SwiGLU, untied
embeddings, and with ``mhc_enabled`` its residual stream widened into ``mhc_flows`` streams joined by
manifold-constrained hyper-connections (``auralm.models.mhc``) around every attention and MLP.

Takes ``(x, y)`` and returns ``(logits, loss)`` like GPT (in training the loss only, taken a chunk of
tokens at a time); ``step(ids, cache)`` runs new tokens against a KV cache for generation.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from auralm.models.chunked_loss import linear_cross_entropy
from auralm.models import mhc
from auralm.models.layers import Rotary, apply_rotary, token_loss
from auralm.models.pretrained import Pretrained
from auralm.models.args import ModelArgs

AMAX_WARN = 2.0  # the composite mixing of a healthy mHC model stays below this (about 1.6 in the paper)


class KVCache:
    """Keys and values of every layer for the tokens seen so far: ``layers[i] = (k, v)``, (B, heads, T, head_dim)."""

    def __init__(self, n_layers: int):
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers
        self.length = 0


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = nn.Linear(d, 3 * heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, d, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        start = cache.length if cache is not None else 0
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).unbind(2)
        cos, sin = rope[0][start:start + T], rope[1][start:start + T]
        q, k = apply_rotary(q, cos, sin).transpose(1, 2), apply_rotary(k, cos, sin).transpose(1, 2)
        v = v.transpose(1, 2)
        if cache is not None:
            if cache.layers[layer] is not None:
                k = torch.cat([cache.layers[layer][0], k], dim=2)
                v = torch.cat([cache.layers[layer][1], v], dim=2)
            cache.layers[layer] = (k, v)
        if start and T > 1:  # new tokens after cached ones: each sees the cache and the new ones before it
            mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(diagonal=start)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        return self.out(a.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, d: int, width: int):
        super().__init__()
        self.gate_up, self.down = nn.Linear(d, 2 * width, bias=False), nn.Linear(width, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """``x + attn(norm(x))``, then ``x + mlp(norm(x))``; with mHC each ``+`` is a hyper-connection over the streams."""

    def __init__(self, arch: ModelArgs, index: int):
        super().__init__()
        d = arch.n_embd
        self.index = index
        self.attn_norm, self.mlp_norm = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
        self.attn = Attention(d, arch.n_head, arch.head_dim)
        self.mlp = SwiGLU(d, arch.ffn_dim)
        if arch.mhc_enabled:
            n, iters = arch.mhc_flows, arch.mhc_sinkhorn_iters
            self.attn_hc, self.mlp_hc = mhc.HyperConnection(d, n, iters), mhc.HyperConnection(d, n, iters)
        else:
            self.attn_hc = self.mlp_hc = None

    def forward(self, x: torch.Tensor, rope, cache: KVCache | None = None) -> torch.Tensor:
        def mix(h):
            return self.attn(self.attn_norm(h), rope, cache, self.index)

        def mlp(h):
            return self.mlp(self.mlp_norm(h))

        if self.attn_hc is None:
            x = x + mix(x)
            return x + mlp(x)
        return self.mlp_hc(self.attn_hc(x, mix), mlp)


class RLMModel(nn.Module, Pretrained):
    """The RLM transformer (``arch``: the resolved ``model`` section; ``vocab_size``: the data's vocabulary
    when the config leaves ``model.vocab_size`` unset)."""

    def __init__(self, arch: ModelArgs, vocab_size: int | None = None):
        super().__init__()
        vocab = arch.vocab_size or vocab_size
        if not vocab:
            raise ValueError("no vocabulary size: set model.vocab_size or train on prepared data")
        if vocab_size and vocab < vocab_size:
            raise ValueError(f"model.vocab_size={vocab} is smaller than the data's vocabulary ({vocab_size})")
        d, L = arch.n_embd, arch.n_layer
        self.arch = arch.replace(vocab_size=vocab)
        self.block_size = arch.block_size
        self.flows = arch.mhc_flows if arch.mhc_enabled else 0
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(arch, i) for i in range(L))
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.rope = Rotary(arch.head_dim, arch.block_size)
        self.grad_checkpointing = False
        for name, p in self.named_parameters():
            if "_hc." in name:
                continue  # the connections keep their own initialisation
            if name.endswith(("attn.out.weight", "mlp.down.weight")):  # into the residual: scaled with depth
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * L))
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def set_grad_checkpointing(self, on: bool) -> None:
        self.grad_checkpointing = on

    def connections(self) -> list[mhc.HyperConnection]:
        """The hyper-connections in the order the signal passes them (empty without mHC)."""
        return [hc for b in self.blocks for hc in (b.attn_hc, b.mlp_hc) if hc is not None]

    def hidden(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        rope = self.rope(x.device)
        h = self.embed(x)
        if self.flows:
            h = mhc.expand(h, self.flows)
        for block in self.blocks:
            if self.grad_checkpointing and self.training and cache is None:
                h = checkpoint(block, h, rope, use_reentrant=False)
            else:
                h = block(h, rope, cache)
        if self.flows:
            h = mhc.collapse(h)
        if cache is not None:
            cache.length += x.shape[1]
        return self.norm(h)

    def forward(self, x, y=None):
        h = self.hidden(x)
        if y is not None and torch.is_grad_enabled():
            return None, linear_cross_entropy(h.reshape(-1, h.shape[-1]), self.lm_head.weight, y.reshape(-1))
        logits = self.lm_head(h)
        return logits, token_loss(logits, y)

    def new_cache(self) -> KVCache:
        return KVCache(len(self.blocks))

    def step(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits (B, T, vocab) of ``ids`` following the tokens already in ``cache`` (which they join)."""
        return self.lm_head(self.hidden(ids, cache))

    def step_figures(self, step: int) -> tuple[dict, str, dict | None]:
        """What the trainer's log line says of this model's last forward (this rank's), at each log step: the
        largest amax of the layers (``mhc/amax_pre``, ``mhc/amax_post``), their text, and a warning event when
        either passes AMAX_WARN; nothing for a model without hyper-connections."""
        per_layer = self.get_mhc_metrics()
        if not per_layer:
            return {}, "", None
        pre, post = max(p for p, _ in per_layer), max(q for _, q in per_layer)
        warning = None
        if max(pre, post) > AMAX_WARN:
            warning = {"kind": "mhc_amax", "pre": pre, "post": post,
                       "message": f"warning: mHC amax at step {step}: pre {pre:.2f}, post {post:.2f} (above "
                                  f"{AMAX_WARN}: the residual mixing amplifies signals; lower training.lr or raise "
                                  f"model.mhc_sinkhorn_iters)"}
        return {"mhc/amax_pre": pre, "mhc/amax_post": post}, f" | amax {pre:.3f}/{post:.3f}", warning

    def get_mhc_metrics(self) -> list[tuple[float, float]]:
        """Per layer: (pre_amax, post_amax) of the composite residual mixing through that layer's attention and
        MLP connections, the larger of the two, in the last forward (auralm.models.mhc); empty without mHC."""
        per = mhc.amax(self.connections())
        return [(max(a[0], b[0]), max(a[1], b[1])) for a, b in zip(per[::2], per[1::2])]
