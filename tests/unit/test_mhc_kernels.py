"""The fused CPU loops of the mHC connections (auralm/kernels/mhc.c) against the same arithmetic in PyTorch's
operations: outputs and every gradient, at awkward sizes, with float32 and bfloat16 streams, in whole models,
with any number of threads; bfloat16 rounding as torch's; and the fallback where no C compiler can build
them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from auralm import kernels, models
from auralm.training import command_line, config
from auralm.models import mhc


def test_the_loops_build_on_this_machine():
    # CI installs a C compiler: a build that broke must fail here, not fall back quietly
    assert kernels.mhc() is not None and kernels.mhc(torch.bfloat16) is not None
    assert kernels.mhc(torch.float16) is None  # not built for: the PyTorch path


def _connection_run(hc: mhc.HyperConnection, sub: torch.nn.Module, x: torch.Tensor, weights: torch.Tensor):
    for p in [*hc.parameters(), *sub.parameters()]:
        p.grad = None
    x = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=x.dtype == torch.bfloat16):
        y = hc(x, sub)
    (y.float() * weights).sum().backward()
    return [y.detach().float(), x.grad.float()] + [p.grad.clone() for p in [*hc.parameters(), *sub.parameters()]]


_F32_CASES = [(37, 4, 13), (64, 1, 8), (50, 3, 32), (300, 4, 64), (9, 4, 80)]
_BF16_CASES = [(37, 4, 13), (300, 4, 64), (9, 3, 80)]


@pytest.mark.parametrize("dtype,tokens,n,d", [(torch.float32, *c) for c in _F32_CASES] +
                         [(torch.bfloat16, *c) for c in _BF16_CASES])
def test_a_fused_connection_gives_pytorchs_output_and_gradients(dtype, tokens, n, d):
    torch.manual_seed(0)
    hc = mhc.HyperConnection(d, n, 20)
    with torch.no_grad():  # away from the start, where the input-dependent parts are small
        hc.gate.fill_(0.7)
        hc.phi.weight.mul_(3)
        hc.res_bias[0, n - 1] -= 100  # below Sinkhorn's floor (where n > 1): exp() clamped, no gradient through it
    sub = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.Tanh())
    x = torch.randn(2, tokens, n, d).to(dtype)  # batch, time: the connection flattens them
    weights = torch.randn(2, tokens, n, d)
    fused = _connection_run(hc, sub, x, weights)
    with kernels.off():
        plain = _connection_run(hc, sub, x, weights)
    names = ["output", "dL/dx"] + [name for name, _ in [*hc.named_parameters(), *sub.named_parameters()]]
    for name, a, b in zip(names, fused, plain):
        assert a.shape == b.shape, name
        if dtype == torch.float32:
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max())), name
        else:
            # both compute in float32 from the same bf16 streams (the projection with bf16 operands) and store
            # bf16: they differ by the order of float32 sums, and dL/dx by a rounding more on the PyTorch path
            # (its parts are rounded to bf16 before they are added); either moves a stored value by about one
            # bf16 step (2^-8 of it)
            assert torch.allclose(a, b, rtol=2e-2, atol=2e-2 * float(b.abs().max())), name
            assert (a - b).abs().mean() < 4e-3 * b.abs().mean() + 1e-7, name  # most values closer than that
    if n > 1:
        res_bias = names.index("res_bias")
        # the fused loops pass no gradient below the floor; PyTorch's passes exp(-60)'s, about nothing
        assert fused[res_bias][0, n - 1] == 0 and abs(float(plain[res_bias][0, n - 1])) < 1e-12
    # and the fused path is what ran: a broken loop (here: the write's output zeroed) must show above
    lib = kernels.mhc(dtype)
    real = lib.mhc_write_forward
    try:
        lib.mhc_write_forward = lambda *a: None  # leaves torch.empty's memory as it is
        broken = _connection_run(hc, sub, torch.zeros_like(x), weights)[0]
    finally:
        lib.mhc_write_forward = real
    with kernels.off():
        assert not torch.equal(broken, _connection_run(hc, sub, torch.zeros_like(x), weights)[0])


def test_bfloat16_streams_are_rounded_as_torch_rounds_and_a_nan_stays_a_nan():
    # out = res x + post f with one stream, post 1 and f 0: one float32 product, then the rounding to bf16
    specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3e38, 1e-40, -1e-40, 1.0 + 2 ** -8,
                1.0 + 3 * 2 ** -8]
    x = torch.cat([torch.tensor(specials), torch.randn(4096 - len(specials)) * 10]).bfloat16().view(-1, 1, 64)
    f = torch.zeros(x.shape[0], 64, dtype=torch.bfloat16)
    for r in (1.0, 1 / 3, 1.0 + 2 ** -9, -7.3):
        res, post = torch.full((x.shape[0], 1, 1), r), torch.ones(x.shape[0], 1)
        out = torch.empty_like(x)
        kernels.mhc(torch.bfloat16).mhc_write_forward(x.shape[0], 1, 64, res.data_ptr(), x.data_ptr(),
                                                      post.data_ptr(), f.data_ptr(), out.data_ptr(), 1)
        want = (x.float() * r).bfloat16()
        assert torch.equal(out.isnan(), want.isnan())
        assert torch.equal(out[~want.isnan()], want[~want.isnan()]), r


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_sublayer_that_ignores_what_it_reads_still_passes_dL_dx_through_the_streams(dtype):
    # dL/dx is made in the coefficients' backward pass, to which the write hands its gradient: it must run even
    # when no gradient reaches what the sublayer reads
    torch.manual_seed(3)
    hc = mhc.HyperConnection(32, 4, 20)
    const = torch.randn(32)
    x = torch.randn(2, 5, 4, 32).to(dtype)
    weights = torch.randn(2, 5, 4, 32)

    def run():
        xg = x.clone().requires_grad_()
        (hc(xg, lambda h: const.expand_as(h).clone()).float() * weights).sum().backward()
        return xg.grad.float()

    fused = run()
    with kernels.off():
        plain = run()
    assert fused.abs().max() > 0.1
    assert torch.allclose(fused, plain, rtol=2e-2, atol=2e-2 * float(plain.abs().max()))


def _model_grads(threads: int, checkpointing: bool = False, bf16: bool = False) -> list[torch.Tensor]:
    cfg = command_line.parse(["task=lm", "model=rlm-tiny", "model.hidden_dim=64", "model.num_heads=2", "model.head_dim=32",
                        "model.ffn_dim=128", "model.num_layers=2"])
    torch.manual_seed(0)
    model = models.build("lm", config.resolved_model(cfg.model), 101)
    model.set_grad_checkpointing(checkpointing)
    x = torch.randint(0, 101, (4, 160), generator=torch.Generator().manual_seed(2))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            _, loss = model(x, x)
        loss.backward()
    finally:
        torch.set_num_threads(before)
    return [loss.detach()] + [p.grad for p in model.parameters()]


def test_a_whole_model_trains_alike_fused_or_not_and_the_same_with_any_number_of_threads():
    one = _model_grads(1)
    # 640 tokens over two threads: each token is computed whole by one thread, so the bits do not change
    assert all(torch.equal(a, b) for a, b in zip(one, _model_grads(2)))
    assert all(torch.equal(a, b) for a, b in zip(one, _model_grads(1, checkpointing=True)))
    with kernels.off():
        plain = _model_grads(1)
    for a, b in zip(one, plain):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5 * float(b.abs().max()) + 1e-9)


def test_under_bf16_autocast_the_streams_are_bfloat16_and_the_model_trains_alike_with_any_number_of_threads():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mhc.expand(torch.randn(2, 3, 8), 4).dtype == torch.bfloat16
        assert mhc.collapse(mhc.expand(torch.randn(2, 3, 8), 4)).dtype == torch.float32
    assert mhc.expand(torch.randn(2, 3, 8), 4).dtype == torch.float32
    with kernels.off(), torch.autocast("cpu", dtype=torch.bfloat16):  # no loops on a CPU: float32 streams
        assert mhc.expand(torch.randn(2, 3, 8), 4).dtype == torch.float32
    one = _model_grads(1, bf16=True)
    assert all(torch.equal(a, b) for a, b in zip(one, _model_grads(2, bf16=True)))
    with kernels.off():
        plain = _model_grads(1, bf16=True)
    assert abs(float(one[0]) - float(plain[0])) < 1e-3 * float(plain[0])  # the loss
    # the gradients, as a whole: bf16 streams round differently on the two paths, and some parameters' gradients
    # are sums that nearly cancel (the connections start with equal streams), so no elementwise bound holds
    flat = torch.cat([g.flatten() for g in one[1:]])
    ref = torch.cat([g.flatten() for g in plain[1:]])
    assert float((flat - ref).norm() / ref.norm()) < 2e-2


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_without_a_compiler_one_warning_says_what_to_install_and_training_goes_on(tmp_path):
    script = """
import warnings, torch
from auralm import kernels
from auralm.models import mhc
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    hc = mhc.HyperConnection(8, 4, 5)
    y = hc(torch.randn(3, 4, 8), torch.nn.Linear(8, 8))
    y.sum().backward()
    hc(torch.randn(3, 4, 8), torch.nn.Linear(8, 8))
print(kernels.mhc(), len(seen), seen[0].message if seen else "")
"""
    env = {"PATH": "/usr/bin:/bin", "CC": "no-such-cc", "AURALM_KERNEL_DIR": str(tmp_path), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lib, count, message = out.stdout.strip().split(" ", 2)
    assert lib == "None" and count == "1"
    assert "no C compiler" in message and "apt install gcc" in message
    assert not list(tmp_path.glob("*.so"))


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_the_build_is_cached_by_its_source_and_flags(tmp_path):
    env_dir = tmp_path / "k"
    script = "from auralm import kernels; print(kernels._build('mhc'))"
    env = {"PATH": "/usr/bin:/bin", "AURALM_KERNEL_DIR": str(env_dir), "HOME": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    path = first.stdout.strip()
    stamp = (env_dir / path.rsplit("/", 1)[1]).stat().st_mtime_ns
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert second.stdout.strip() == path
    assert (env_dir / path.rsplit("/", 1)[1]).stat().st_mtime_ns == stamp  # not built again
    assert [p.name for p in env_dir.iterdir()] == [path.rsplit("/", 1)[1]]  # no temporary file left
