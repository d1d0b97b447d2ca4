"""The stablemax cross-entropy (HRM's loss_type=stablemax): its value and gradient are finite for every finite logit,
in bf16 and fp32, and equal the formula's (log of s(x) / sum s(x), s(x) = x + 1 above 0, 1 / (1 - x) below).

The bug this guards against: s(x) was written as ``where(x >= 0, x + 1, 1 / (1 - x))``, whose unused branch is
1 / 0 at a logit of exactly 1.0, and its backward 0 x inf = NaN; bf16 rounds logits to 1.0 often, so the HRM
guide's own line had a non-finite gradient on every step under the default dtype.
"""

from __future__ import annotations

import pytest
import torch

from auralm.models.layers import IGNORE, _log_stablemax, per_token_loss

DTYPES = [torch.float32, torch.bfloat16]


def reference_logp(x: torch.Tensor) -> torch.Tensor:
    """log(s(x) / sum s(x)) in float64, straight from the definition (its value only: no gradient taken)."""
    x = x.double()
    s = torch.where(x >= 0, x + 1, 1 / (1 - x))
    return torch.log(s / s.sum(-1, keepdim=True))


def around(v: float, dtype: torch.dtype) -> list[float]:
    """v and its nearest representable neighbours in ``dtype``."""
    t = torch.tensor([v], dtype=dtype)
    return [float(torch.nextafter(t, torch.tensor([-1e30], dtype=dtype))), v,
            float(torch.nextafter(t, torch.tensor([1e30], dtype=dtype)))]


def points(dtype: torch.dtype) -> list[float]:
    info = torch.finfo(dtype)
    near = [p for v in (0.0, 1.0, -1.0) for p in around(v, dtype)]
    return near + [0.5, -0.5, 2.0, -2.0, 7.0, -30.0, info.tiny, -info.tiny, info.max, -info.max, info.max / 4]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("target", [0, 1, 2])
def test_value_and_gradient_are_finite_at_0_1_minus_1_around_them_and_at_the_extremes(dtype, target):
    for v in points(dtype):
        # the logit under test at each position in turn, beside ordinary logits (one of them exactly 1.0 as well)
        for where in range(3):
            row = [0.25, 1.0, -0.75]
            row[where] = v
            x = torch.tensor([row], dtype=dtype, requires_grad=True)
            loss = per_token_loss(x, torch.tensor([target]), "stablemax").sum()
            loss.backward()
            assert torch.isfinite(loss), (v, where, target, float(loss))
            assert torch.isfinite(x.grad).all(), (v, where, target, x.grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
def test_a_row_of_logits_all_exactly_1_has_a_finite_zero_sum_gradient(dtype):
    x = torch.ones(4, 10, dtype=dtype, requires_grad=True)
    loss = per_token_loss(x, torch.tensor([3, 0, 9, IGNORE]), "stablemax")
    loss.sum().backward()
    assert torch.allclose(loss[:3].float(), torch.full((3,), torch.log(torch.tensor(10.0)).item()))
    assert float(loss[3].detach()) == 0.0  # an ignored position costs nothing ...
    assert torch.equal(x.grad[3], torch.zeros(10, dtype=dtype))  # ... and pulls on nothing
    g = x.grad[:3].float()
    assert torch.isfinite(g).all() and torch.allclose(g.sum(-1), torch.zeros(3), atol=1e-2)
    assert torch.all(g[0, 3] < 0) and torch.all(g[0, :3] > 0)  # the target's logit is pushed up, the others down


def test_the_value_is_the_formulas_and_the_gradient_matches_finite_differences():
    torch.manual_seed(0)
    x = torch.randn(6, 11, dtype=torch.float64) * 3
    x[0, :5] = torch.tensor([1.0, 0.0, -1.0, 1.0, 1e-9])  # the points where s(x) changes formula, and x = 1
    y = torch.randint(0, 11, (6,))
    y[2] = IGNORE
    got = per_token_loss(x.float(), y, "stablemax")
    want = -reference_logp(x).gather(-1, torch.where(y == IGNORE, 0, y).unsqueeze(-1)).squeeze(-1)
    want = torch.where(y == IGNORE, 0.0, want)
    assert torch.allclose(got.double(), want, atol=1e-5)
    # float64 gradients against central differences (s(x) has a continuous first derivative, also at 0)
    assert torch.autograd.gradcheck(_log_stablemax, (x.clone().requires_grad_(),))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device on this machine: the CPU run checks the same code"))])
def test_finite_under_autocast_in_bf16_as_training_runs_it(device):
    """The model's logits come out of a bf16 autocast region (training.dtype=bf16, the default), the loss is taken
    inside it; one code path for CPU and GPU."""
    torch.manual_seed(1)
    w = torch.randn(16, 10, device=device, requires_grad=True)
    h = torch.randn(32, 16, device=device)
    h[:, 0] = 0.0
    y = torch.randint(0, 10, (32,), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        logits = h @ w
        logits = torch.where(torch.arange(10, device=device) < 3, torch.ones_like(logits), logits)  # many exact 1s
        loss = per_token_loss(logits, y, "stablemax").mean()
    loss.backward()
    assert logits.dtype == torch.bfloat16 and bool((logits == 1).any())
    assert torch.isfinite(loss) and torch.isfinite(w.grad).all() and bool(w.grad.abs().sum() > 0)
