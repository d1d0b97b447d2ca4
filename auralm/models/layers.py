"""Layers the model families share: norms, rotary positions, SwiGLU, attention, the block (post- or pre-norm), losses.

HRM and TRM use the weightless RMSNorm after each residual add (post-norm), rotary or learned
positions, SwiGLU and bias-free projections with LeCun-normal initialisation; the sudoku
positions (row + column + box embeddings) are this project's option for a 9x9 grid.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE = -100


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or as it is when wider (float64 stays float64: a float64 run rounds nowhere to float32)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def token_loss(logits: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor | None:
    """Mean cross-entropy over the positions of ``y`` that are not -100 (None without targets)."""
    if y is None:
        return None
    return F.cross_entropy(at_least_fp32(logits.reshape(-1, logits.size(-1))), y.reshape(-1), ignore_index=IGNORE)


def _log_stablemax(x: torch.Tensor) -> torch.Tensor:
    """log(s(x) / sum s(x)) over the last dimension, s(x) = x + 1 above 0 and 1 / (1 - x) below, taken in logs:
    log s(x) = log1p(x) above 0, -log1p(-x) below, then minus their logsumexp. Each branch is given only the
    inputs of its own side (clamped), so the unused one is never evaluated at a pole: written as
    ``where(x >= 0, x + 1, 1 / (1 - x))`` it was 1 / 0 at x = 1.0 and its backward 0 x inf = NaN, at a logit
    bf16 rounds to often. In logs nothing overflows either: value and gradient are finite for every finite x."""
    log_s = torch.where(x >= 0, torch.log1p(x.clamp(min=0)), -torch.log1p(-x.clamp(max=0)))
    return log_s - torch.logsumexp(log_s, dim=-1, keepdim=True)


def per_token_loss(logits: torch.Tensor, y: torch.Tensor, kind: str = "softmax") -> torch.Tensor:
    """Cross-entropy per position, shape of ``y``, 0 where ``y`` is -100; ``kind="stablemax"`` is the
    numerically stable variant of the HRM code (s(x) in place of exp(x)), taken in float64 as theirs takes it
    (models/losses.py ``stablemax_cross_entropy``) and returned in float32 (float64 for float64 logits)."""
    if kind == "stablemax":
        logp = _log_stablemax(logits.double())
        safe = torch.where(y == IGNORE, 0, y)
        nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        return torch.where(y == IGNORE, 0.0, nll).to(torch.promote_types(logits.dtype, torch.float32))
    flat = F.cross_entropy(at_least_fp32(logits.reshape(-1, logits.size(-1))), y.reshape(-1), ignore_index=IGNORE,
                           reduction="none")
    return flat.view(y.shape)


def rms_norm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm without a learned scale (HRM's post-norm)."""
    return x * torch.rsqrt(at_least_fp32(x).pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


def lecun_(t: torch.Tensor, fan_in: int | None = None) -> torch.Tensor:
    """Truncated normal (at 2 std) with std 1/sqrt(fan_in), in place."""
    std = 1.0 / math.sqrt(fan_in or t.shape[-1])
    return nn.init.trunc_normal_(t, std=std, a=-2 * std, b=2 * std)


def linear(d_in: int, d_out: int, bias: bool = False) -> nn.Linear:
    layer = nn.Linear(d_in, d_out, bias=bias)
    lecun_(layer.weight.data)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


class Rotary(nn.Module):
    """Rotary position embedding tables for ``length`` positions (kept as plain tensors, not buffers:
    DDP would broadcast buffers every step). Made on the CPU, also when the model is built under another device's
    context (the size estimate's meta device: computing them there runs torch's Python reference kernels, whose
    first use imports torch._dynamo, 1.4 s); ``forward`` moves them where the activations are."""

    def __init__(self, head_dim: int, length: int, base: float = 10000.0):
        super().__init__()
        cpu = torch.device("cpu")
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=cpu) / head_dim))
        freqs = torch.outer(torch.arange(length, dtype=torch.float32, device=cpu), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.tables = {cpu: (emb.cos(), emb.sin())}

    def forward(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self.tables:
            cos, sin = self.tables[torch.device("cpu")]
            self.tables[device] = (cos.to(device), sin.to(device))
        return self.tables[device]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` is (B, T, heads, head_dim); the tables are (T, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos[: x.shape[1], None, :].to(x.dtype), sin[: x.shape[1], None, :].to(x.dtype)
    return x * cos + rotated * sin


def swiglu_width(d: int, expansion: float, multiple: int | None = None) -> int:
    """The hidden width of a SwiGLU with the parameters of a ``expansion``x MLP, rounded up to a multiple of 64
    (256 from width 512 on, as in the HRM code), or of ``multiple``."""
    multiple = multiple or (256 if d >= 512 else 64)
    return -(-round(expansion * d * 2 / 3) // multiple) * multiple


class SwiGLU(nn.Module):
    def __init__(self, d: int, expansion: float, multiple: int | None = None):
        super().__init__()
        inter = swiglu_width(d, expansion, multiple)
        self.gate_up, self.down = linear(d, 2 * inter), linear(inter, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Attention(nn.Module):
    """Multi-head self-attention through ``scaled_dot_product_attention``, bias-free, optional rotary positions."""

    def __init__(self, d: int, n_head: int, causal: bool):
        super().__init__()
        self.n_head, self.causal = n_head, causal
        self.qkv, self.out = linear(d, 3 * d), linear(d, d)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """``bias``: (heads, T, T) added to the attention logits (the sudoku relations), or None."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).unbind(2)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=None if bias is None else bias.to(q.dtype),
                                           is_causal=self.causal and bias is None)
        return self.out(a.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """HRM's post-norm block, ``x = norm(x + mix(x)); x = norm(x + mlp(x))``, or with ``pre_norm`` the
    pre-norm order, ``x = x + mix(norm(x)); x = x + mlp(norm(x))``. ``mix`` is attention, or (TRM's
    ``mlp_t``) a SwiGLU across the sequence positions, for a fixed-length input such as a sudoku grid; post-norm,
    the norm after it is then taken over the positions, as the TRM code takes it (bench/reference_check.py)."""

    def __init__(self, d: int, n_head: int, expansion: float, causal: bool, mlp_t_len: int = 0,
                 pre_norm: bool = False):
        super().__init__()
        self.attn = Attention(d, n_head, causal) if not mlp_t_len else None
        # over the positions, rounded to 256 as the TRM code rounds it (16 + 81 positions: 512 wide, not 320)
        self.mix_t = SwiGLU(mlp_t_len, expansion, multiple=256) if mlp_t_len else None
        self.mlp = SwiGLU(d, expansion)
        self.pre_norm = pre_norm

    def mix(self, x: torch.Tensor, rope, bias) -> torch.Tensor:
        if self.mix_t is not None:
            return self.mix_t(x.transpose(1, 2)).transpose(1, 2)
        return self.attn(x, rope, bias)

    def forward(self, x: torch.Tensor, rope=None, bias=None) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.mix(rms_norm(x), rope, bias)
            return x + self.mlp(rms_norm(x))
        if self.mix_t is not None:  # as the TRM code: the norm after the MLP over the positions is over the positions
            x = rms_norm((x + self.mix(x, rope, bias)).transpose(1, 2)).transpose(1, 2)
        else:
            x = rms_norm(x + self.mix(x, rope, bias))
        return rms_norm(x + self.mlp(x))


SUDOKU_RELATIONS = 6  # self, same row, same column, same box (not row or column), no relation, a prefix position


def sudoku_relations(n_prefix: int = 0) -> torch.Tensor:
    """(81 + n_prefix)^2 relation ids between positions: which constraint, if any, joins two cells. On the CPU, also
    under another device's context (as Rotary's tables: the callers keep it as the CPU's, moved where needed)."""
    i = torch.arange(81, device="cpu")
    r, c = i // 9, i % 9
    b = 3 * (r // 3) + c // 3
    same_r, same_c, same_b = r[:, None] == r, c[:, None] == c, b[:, None] == b
    rel = torch.full((81, 81), 4, device="cpu")
    rel[same_b] = 3
    rel[same_c] = 2
    rel[same_r] = 1
    rel[i, i] = 0
    return F.pad(rel, (n_prefix, 0, n_prefix, 0), value=5)


def sudoku_positions(row: torch.Tensor, col: torch.Tensor, box: torch.Tensor) -> torch.Tensor:
    """Cell i = 9 * r + c gets row[r] + col[c] + box[3 * (r // 3) + c // 3]: (81, d), no index buffer."""
    d = row.shape[1]
    return (row.repeat_interleave(9, dim=0) + col.repeat(9, 1)
            + box.view(3, 1, 3, 1, d).expand(3, 3, 3, 3, d).reshape(81, d))
