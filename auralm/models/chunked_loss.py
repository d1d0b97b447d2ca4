"""Cross-entropy of an LM head, ``cross_entropy(h @ w.T, y)``, a chunk of rows at a time.

The plain way writes the whole ``(tokens, vocab)`` logits, their log-softmax, a zero-filled
gradient of the same size, and reads them back again in backward: at a small model's width these
passes over memory cost more than the matmuls. Here each chunk's logits are made, turned into
``softmax - onehot`` in place while they are still in cache, and folded into the gradients of
``h`` and ``w`` at once; backward only scales them. The numbers are the same as the plain way's
(up to float rounding); only positions with ``y == -100`` are left out, as in ``F.cross_entropy``.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 1 << 20  # logits per chunk: 4 MiB of float32, near a core's share of the cache ...


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        device = h.device.type
        # the matmuls run in autocast's dtype where it is on (bf16 on CUDA), the softmax in float32 or wider
        mm = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype
        acc = torch.promote_types(mm, torch.float32)
        rows = max(CHUNK_ELEMENTS // w.shape[0], w.shape[1])  # ... but no fewer rows than the width, or the
        # update of w's gradient (vocab x width, once per chunk) would cost more than the cache saves
        keep = y != -100
        scale = (keep / keep.sum().clamp(min=1)).to(acc)[:, None]  # d(mean loss)/d(each position's loss)
        grad_h = torch.empty(h.shape, dtype=mm, device=h.device)
        grad_w = torch.empty(w.shape, dtype=acc, device=w.device)
        total = torch.zeros((), dtype=acc, device=h.device)
        with torch.autocast(device, enabled=False):
            wm = w.to(mm)
            for s in range(0, h.shape[0], rows):
                hc, yc, sc = h[s:s + rows].to(mm), y[s:s + rows, None].clamp(min=0), scale[s:s + rows]
                logp = torch.log_softmax((hc @ wm.t()).to(acc), dim=1)
                total -= (logp.gather(1, yc) * sc).sum()
                grad = logp.exp_().scatter_add_(1, yc, torch.full_like(sc, -1.0)).to(mm)  # softmax - onehot
                # the mean's weight of each position (0 where left out) goes on the narrow side: rows x width
                torch.mm(grad, wm, out=grad_h[s:s + rows]).mul_(sc)
                if mm == acc:  # beta=0: the first chunk overwrites grad_w's uninitialised memory
                    grad_w.addmm_(grad.t(), hc * sc, beta=1 if s else 0)
                else:
                    update = (grad.t() @ (hc * sc).to(mm)).to(acc)
                    grad_w.add_(update) if s else grad_w.copy_(update)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = h.dtype, w.dtype
        return total

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        dh, dw = ctx.dtypes
        if not grad_loss.is_cuda and grad_loss.item() == 1.0:  # the usual case: no pass over the gradients
            return grad_h.to(dh), grad_w.to(dw), None
        return (grad_h * grad_loss.to(grad_h.dtype)).to(dh), (grad_w * grad_loss.to(grad_w.dtype)).to(dw), None


def linear_cross_entropy(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``h @ w.T`` (``h``: (tokens, width), ``w``: (vocab, width)) against ``y``."""
    return _LinearCrossEntropy.apply(h, w, y)
