"""Manifold-constrained hyper-connections (mHC; Xie et al., DeepSeek 2025, on Hyper-Connections, Zhu et al. 2025).

The residual stream becomes ``n`` parallel streams ``x`` of shape (..., n, d). Around a sublayer F:

    x' = H_res x + H_post^T F(H_pre x)

- ``H_pre`` (1 x n) = sigmoid(.): the sublayer reads a non-negative mix of the streams;
- ``H_post`` (1 x n) = 2 sigmoid(.): its output is written back to every stream with its own weight;
- ``H_res`` (n x n) = Sinkhorn-Knopp(exp(.)): the streams are mixed by a doubly stochastic matrix
  (rows and columns sum to 1), so the residual path neither grows nor shrinks a signal in total.

Each of the three is ``gate * (RMSNorm(flattened streams) @ phi) + static``: an input-dependent part
(one linear map from the n*d values of a token's streams), scaled by a learnable gate that starts
small (0.01), and a static part. The static parts start where the block is a plain residual:
``H_pre`` = 1/n on every stream (the streams start equal, so the sublayer reads ``x``), ``H_post`` = 1
and ``H_res`` near the identity; with one stream and the gates at zero it is exactly ``x + F(x)``.

Metrics (docs/rlm.md): the composite residual mixing ``P_l = H_res^l ... H_res^1`` of every layer,
its largest absolute row sum (``amax_pre``: how much the forward signal can grow through the
residual paths up to layer l) and column sum (``amax_post``: the same for the gradient going back),
taken over the tokens of the last forward; 1.0 for exact doubly stochastic matrices.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from auralm import kernels

GATE_INIT = 0.01
RES_DIAGONAL = 2.0  # H_res's static logits: this on the diagonal, 0 elsewhere (diagonal 0.71 at n=4; more peaked
# starts converge slower in Sinkhorn: at 4.0 (0.95) 20 rounds left rows 2% off after training at a high lr)
MAX_FUSED_FLOWS = 8  # mhc.c's MAX_N: more streams take the PyTorch path
_LOGIT_FLOOR = -60.0  # exp() of logits below the row maximum by more than this would underflow


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """The doubly stochastic matrices of ``exp(logits)`` (n, n, ...) by ``iters`` rounds of row then column
    normalisation (Sinkhorn-Knopp), in float32; columns sum to 1 exactly, rows to within the convergence.

    The matrix dimensions come first: with the tokens last and contiguous each reduction is a few vector
    adds, five times faster on a CPU than over (..., n, n). The rounds run in place with no autograd record
    (``_Sinkhorn``): the backward pass goes back through the same rounds by hand, the gradient autograd would
    give, at half the passes over memory and a fraction of the bookkeeping."""
    shape = logits.shape
    return _Sinkhorn.apply(logits.float().reshape(shape[0], shape[1], -1).contiguous(), iters).view(shape)


class _Sinkhorn(torch.autograd.Function):
    """Keeps only the result and each round's sums (n numbers per matrix): every earlier iterate is the later
    one times the sums it was divided by, so the backward pass rebuilds them in place as it goes."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, iters: int) -> torch.Tensor:
        z = logits - logits.amax(dim=(0, 1), keepdim=True)  # a shift of all logits leaves the result as is
        m = z.clamp_(min=_LOGIT_FLOOR).exp_()
        sums = []
        for _ in range(iters):
            for dim in (1, 0):
                sums.append(m.sum(dim=dim, keepdim=True))
                m.div_(sums[-1])
        ctx.save_for_backward(m, *sums)
        return m  # saved as the output it is

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Back through m' = m / s, s = m summed over one dimension: dL/dm = (dL/dm' - sum(dL/dm' * m')) / s;
        then m = m' * s. At the start m = exp(z - max z), so dL/dz = dL/dm * m (the shift changes nothing)."""
        m, *sums = ctx.saved_tensors
        m, g = m.clone(), grad.contiguous().clone()  # the saved result stays as it is (a second backward)
        for k in range(len(sums) - 1, -1, -1):
            dim = 1 if k % 2 == 0 else 0
            g.sub_((g * m).sum(dim=dim, keepdim=True)).div_(sums[k])
            m.mul_(sums[k])
        return g.mul_(m), None


def _logit(p: float) -> float:
    return math.log(p / (1 - p)) if p < 1 else 20.0  # sigmoid(20.0) is 1.0 in float32


class HyperConnection(nn.Module):
    """The connection of one sublayer: ``forward(x, sublayer)`` with x (..., n, d) -> (..., n, d)."""

    def __init__(self, d: int, n: int, sinkhorn_iters: int):
        super().__init__()
        self.n, self.iters = n, sinkhorn_iters
        self.phi = nn.Linear(n * d, 2 * n + n * n, bias=False)  # the input-dependent parts: pre | post | res
        nn.init.normal_(self.phi.weight, std=1.0 / math.sqrt(n * d))
        self.gate = nn.Parameter(torch.full((3,), GATE_INIT))  # pre, post, res
        self.pre_bias = nn.Parameter(torch.full((n,), _logit(1.0 / n)))
        self.post_bias = nn.Parameter(torch.zeros(n))  # 2 sigmoid(0) = 1
        self.res_bias = nn.Parameter(torch.eye(n).mul_(RES_DIAGONAL))  # in place: skipped on meta (on_meta)
        self.last_res: torch.Tensor | None = None  # H_res of every token of the last forward, (tokens, n, n)

    def coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """For streams x (tokens, n, d): H_pre (tokens, n), H_post (tokens, n), H_res (tokens, n, n), in float32."""
        n = self.n
        flat = x.flatten(-2)
        # RMSNorm(flat) @ phi, with the norm's per-token scale applied after the product (the same numbers,
        # one pass over the streams fewer); the product in the streams' type, as autocast runs a linear layer
        # (float32 streams: float32; bf16 streams: bf16 operands, float32 sums), the rest in float32
        with torch.autocast(x.device.type, enabled=False):
            z = F.linear(flat, self.phi.weight.to(x.dtype)).float() * _RMSScale.apply(flat.float())[:, None]
        g = self.gate.float()
        pre = torch.sigmoid(g[0] * z[:, :n] + self.pre_bias)
        post = 2 * torch.sigmoid(g[1] * z[:, n:2 * n] + self.post_bias)
        # Sinkhorn with the tokens last and contiguous: its reductions over the other layout are five times slower
        res = sinkhorn(g[2] * z[:, 2 * n:].t().contiguous().unflatten(0, (n, n)) + self.res_bias[:, :, None],
                       self.iters)
        return pre, post, res.permute(2, 0, 1).contiguous()

    def forward(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, self.n, shape[-1]).contiguous()  # (tokens, n, d)
        if x.device.type == "cpu" and self.n <= MAX_FUSED_FLOWS and kernels.mhc(x.dtype) is not None:
            return self._forward_fused(x, sublayer, shape)
        # computed as the fused loops do: in float32, the streams only stored in their own type (``expand``)
        pre, post, res = self.coefficients(x)
        xs = x.float()
        self.last_res = res.detach()
        # outside autocast, which would take the mixing to bf16, casting the n streams there and back
        with torch.autocast(x.device.type, enabled=False):
            inp = _Read.apply(pre, xs)  # (tokens, d)
        out = sublayer(inp.view(*shape[:-2], shape[-1])).reshape(-1, shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            return _Write.apply(res, xs, post, out.float()).to(x.dtype).view(shape)

    def _forward_fused(self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor],
                       shape: torch.Size) -> torch.Tensor:
        """``forward`` on a CPU, the same arithmetic in the fused loops of auralm/kernels/mhc.c: every pass over
        the streams that can be one is one."""
        handoff = _Handoff()
        with torch.autocast(x.device.type, enabled=False):
            inp, post, res = _Coefficients.apply(x, self.phi.weight.float(), self.gate.float(),
                                                 self.pre_bias.float(), self.post_bias.float(),
                                                 self.res_bias.float(), self.iters, handoff)
        self.last_res = res.detach()
        out = sublayer(inp.view(*shape[:-2], shape[-1])).reshape(-1, shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            return _FusedWrite.apply(res, x.detach(), post, out.to(x.dtype), handoff).view(shape)

    @torch.no_grad()
    def get_connection_matrix(self) -> torch.Tensor:
        """H_res (n x n): its mean over the tokens of the last forward (a mean of doubly stochastic
        matrices is one), or before any forward its static part."""
        if self.last_res is not None:
            return self.last_res.double().mean(0).float()
        return sinkhorn(self.res_bias, self.iters)


class _RMSScale(torch.autograd.Function):
    """1 / RMS of every row of (tokens, k); by hand so that the backward pass is one pass over the rows
    (autograd's goes through a broadcast gradient whose product is laid out tokens-first, then copied)."""

    @staticmethod
    def forward(ctx, flat: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(torch.linalg.vector_norm(flat, dim=-1).square_().div_(flat.shape[-1]).add_(1e-6))
        ctx.save_for_backward(flat, scale)
        return scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        flat, scale = ctx.saved_tensors
        return flat * (grad * scale.pow(3) / -flat.shape[-1])[:, None]


class _Read(torch.autograd.Function):
    """What the sublayer reads, H_pre x: (tokens, n), (tokens, n, d) -> (tokens, d). By hand, with every
    product a batched matrix product over contiguous operands (autograd's transposed views and outer products
    send torch's CPU bmm into a loop over the tokens)."""

    @staticmethod
    def forward(ctx, pre: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(pre, x)
        return torch.bmm(pre.unsqueeze(1), x).squeeze(1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pre, x = ctx.saved_tensors
        grad = grad.contiguous()
        return torch.bmm(x, grad.unsqueeze(-1)).squeeze(-1), pre.unsqueeze(-1) * grad.unsqueeze(1)


class _Write(torch.autograd.Function):
    """The new streams, H_res x + H_post^T f: (tokens, n, n), (tokens, n, d), (tokens, n), (tokens, d) ->
    (tokens, n, d); by hand for the reason _Read gives."""

    @staticmethod
    def forward(ctx, res: torch.Tensor, x: torch.Tensor, post: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(res, x, post, f)
        return torch.bmm(res, x).addcmul_(post.unsqueeze(-1), f.unsqueeze(1))

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        res, x, post, f = ctx.saved_tensors
        grad = grad.contiguous()
        return (torch.bmm(grad, x.transpose(1, 2)), torch.bmm(res.transpose(1, 2), grad),
                torch.bmm(grad, f.unsqueeze(-1)).squeeze(-1), torch.bmm(post.unsqueeze(1), grad).squeeze(1))


def stream_dtype(h: torch.Tensor) -> torch.dtype:
    """The type the streams are stored in: bfloat16 under bf16 autocast, as the paper's kernels keep them (every
    sum is still taken in float32; the n streams are what mHC adds to a step's memory traffic, and bf16 halves
    it), else ``h``'s. On a CPU without the fused loops they stay float32: PyTorch's operations would spend more
    on casting them each way than the smaller streams save (0.56 against 0.61 of the plain model's speed)."""
    device = h.device.type
    if (torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.bfloat16
            and (device != "cpu" or kernels.mhc(torch.bfloat16) is not None)):
        return torch.bfloat16
    return h.dtype


def expand(h: torch.Tensor, n: int) -> torch.Tensor:
    """The embedding (..., d) as n equal streams (..., n, d), of ``stream_dtype``."""
    return h.to(stream_dtype(h)).unsqueeze(-2).expand(*h.shape[:-1], n, h.shape[-1]).contiguous()


def collapse(x: torch.Tensor) -> torch.Tensor:
    """The streams (..., n, d) read out as their mean (..., d), in float32 (what a plain residual stream is)."""
    return _Collapse.apply(x)


class _Collapse(torch.autograd.Function):
    """``collapse``, with its gradient (1/n of the output's, the same for every stream) made once per token and
    copied out to the n streams in their type: autograd's divides a float32 copy of all n streams, then casts it
    (3.6 ms against 0.5 ms at 2048 tokens of 4 x 256 bf16 streams)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.shape, ctx.dtype = x.shape, x.dtype
        return x.mean(-2, dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return (grad / ctx.shape[-2]).to(ctx.dtype).unsqueeze(-2).expand(ctx.shape).contiguous()


@torch.no_grad()
def amax(connections: list[HyperConnection]) -> list[tuple[float, float]]:
    """(amax_pre, amax_post) of every connection in order: the largest absolute row and column sum of the
    composite ``H_res`` of this and all earlier connections, the worst token of the last forward."""
    out, composite = [], None
    for hc in connections:
        if hc.last_res is None:
            return []
        res = hc.last_res.double()
        if composite is not None and composite.shape != res.shape:
            return []
        composite = res if composite is None else res @ composite
        out.append((float(composite.abs().sum(-1).amax()), float(composite.abs().sum(-2).amax())))
    return out


# ---- the fused CPU path (streams float32 or bfloat16, the rest float32; the loops are in auralm/kernels/mhc.c) ----

def _ptr(t: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> int | None:
    if t is None:
        return None
    assert t.dtype == dtype and t.is_contiguous()
    return t.data_ptr()


class _Handoff:
    """The write's output gradient and its sublayer's output f, handed from the write's backward pass to its
    coefficients' (which autograd always runs after it: the write needs the coefficients), where one pass over the
    streams makes the gradients of H_res and H_post through the write and dL/dx whole: x goes into the write
    detached, so autograd has only one dL/dx to make, and no sum of two to take over the streams."""

    def __init__(self):
        self.f: torch.Tensor | None = None
        self.grad: torch.Tensor | None = None


class _Coefficients(torch.autograd.Function):
    """For streams x (tokens, n, d): H_pre, H_post and H_res (Sinkhorn's, in blocks of 16 tokens) of every
    token from z = RMSNorm(flattened x) @ phi^T, and what the sublayer reads, H_pre x (tokens, d, float32),
    in one pass of mhc_coefficients_forward over the streams after BLAS made phi @ x^T; the backward pass
    makes the gradients of H_res and H_post through the write, then dL/dx, in one pass too: the write's,
    H_pre's, phi's and the norm's parts together."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, pre_bias: torch.Tensor,
                post_bias: torch.Tensor, res_bias: torch.Tensor, iters: int, handoff: _Handoff):
        T, n, d = x.shape
        # the product in the streams' type: for bf16 on the CPU's bf16 matrix units, as autocast runs every
        # linear layer (the norm's scale is applied after it, in the loop); made as phi @ x^T, (m, T), and
        # transposed while it is widened: with the m = 2n + n^2 outputs as the product's rows BLAS runs it in
        # half the time of x @ phi^T (bf16: 0.66 against 1.42 ms at 2048 tokens of 4 x 256 streams)
        z = torch.empty(T, weight.shape[0])
        z.copy_((weight.to(x.dtype) @ x.view(T, n * d).t()).t())
        bias = torch.cat([pre_bias, post_bias, res_bias.flatten()])
        scale, pre, post, inp = torch.empty(T), torch.empty(T, n), torch.empty(T, n), torch.empty(T, d)
        res, sums = torch.empty(T, n, n), torch.empty(-(-T // 16), 2 * iters * n, 16)
        kernels.mhc(x.dtype).mhc_coefficients_forward(
            T, n, d, z.shape[1], iters, _LOGIT_FLOOR, _ptr(gate), _ptr(bias), _ptr(x, x.dtype), _ptr(z), _ptr(scale),
            _ptr(pre), _ptr(post), _ptr(res), _ptr(sums), _ptr(inp), torch.get_num_threads())
        ctx.save_for_backward(x, weight, gate, bias, z, scale, pre, post, res, sums)
        ctx.iters, ctx.handoff = iters, handoff
        ctx.set_materialize_grads(False)  # H_post's and H_res's gradients come from the write, by the handoff
        return inp, post, res

    @staticmethod
    def backward(ctx, g_inp: torch.Tensor, g_post: torch.Tensor, g_res: torch.Tensor):
        x, weight, gate, bias, z, scale, pre, post, res, sums = ctx.saved_tensors
        T, n, d = x.shape
        s = x.dtype
        g_inp = torch.zeros(T, d) if g_inp is None else g_inp.float().contiguous()
        g_post = None if g_post is None else g_post.contiguous()  # the write's zeros (_FusedWrite), or more
        g_res = None if g_res is None else g_res.contiguous()
        grad, f = ctx.handoff.grad, ctx.handoff.f  # grad None: the write's output reached no loss
        ctx.handoff.grad = ctx.handoff.f = None
        G, coef, gx = torch.empty_like(z), torch.empty_like(z), torch.empty_like(x)
        kernels.mhc(s).mhc_coefficients_backward(
            T, n, d, z.shape[1], ctx.iters, _LOGIT_FLOOR, _ptr(gate), _ptr(bias), _ptr(x, s), _ptr(z), _ptr(scale),
            _ptr(pre), _ptr(post), _ptr(res), _ptr(sums), _ptr(weight), _ptr(g_inp), _ptr(g_post), _ptr(g_res),
            _ptr(grad, s), _ptr(f, s), _ptr(G), _ptr(coef), _ptr(gx, s), torch.get_num_threads())
        g_weight = (coef.t().to(s) @ x.view(T, n * d)).float()
        g_bias = G.sum(0)  # G = dL/d(gate z + bias)
        g_gate = torch.stack([part.sum() for part in (G * z).sum(0).split([n, n, n * n])])
        return gx, g_weight, g_gate, g_bias[:n], g_bias[n:2 * n], g_bias[2 * n:].view(n, n), None, None


class _FusedWrite(torch.autograd.Function):
    """``_Write`` in one pass over the tokens each way, f and the new streams in the streams' type; its backward
    pass makes dL/df, and hands the rest (the gradients of H_res, H_post and x) to the coefficients' (``_Handoff``)."""

    @staticmethod
    def forward(ctx, res: torch.Tensor, x: torch.Tensor, post: torch.Tensor, f: torch.Tensor,
                handoff: _Handoff) -> torch.Tensor:
        res, post, f = res.contiguous(), post.contiguous(), f.contiguous()
        T, n, d = x.shape
        out = torch.empty_like(x)
        kernels.mhc(x.dtype).mhc_write_forward(T, n, d, _ptr(res), _ptr(x, x.dtype), _ptr(post), _ptr(f, x.dtype),
                                               _ptr(out, x.dtype), torch.get_num_threads())
        ctx.save_for_backward(post)
        ctx.handoff, handoff.f = handoff, f
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (post,) = ctx.saved_tensors
        s = ctx.handoff.f.dtype
        grad = grad.to(s).contiguous()
        T, d = ctx.handoff.f.shape
        g_f = torch.empty(T, d, dtype=s)
        kernels.mhc(s).mhc_write_backward(T, post.shape[1], d, _ptr(grad, s), _ptr(post), _ptr(g_f, s),
                                          torch.get_num_threads())
        ctx.handoff.grad = grad
        # a gradient for H_post, if only zeros: the coefficients' backward pass, which makes dL/dx, must run even
        # where the sublayer's output does not depend on what it reads
        return None, None, torch.zeros_like(post), g_f, None
