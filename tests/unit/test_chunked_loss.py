"""The chunked LM-head loss gives the plain loss and the plain gradients; the GPT trains with it."""

import pytest
import torch
import torch.nn.functional as F

from auralm import models
from auralm.models import chunked_loss
from auralm.models.gpt.spec import PlainArgs


def plain(h, w, y):
    return F.cross_entropy(h @ w.t(), y, ignore_index=-100)


@pytest.mark.parametrize("chunk", [1 << 18, 300])  # one chunk; many chunks with a ragged last one
def test_loss_and_gradients_equal_the_plain_cross_entropy(monkeypatch, chunk):
    monkeypatch.setattr(chunked_loss, "CHUNK_ELEMENTS", chunk)
    torch.manual_seed(0)
    h, w = torch.randn(70, 24, dtype=torch.float64), torch.randn(50, 24, dtype=torch.float64)
    y = torch.randint(0, 50, (70,))
    y[::7] = -100  # positions without a target
    got = [t.clone().requires_grad_() for t in (h, w)]
    want = [t.clone().requires_grad_() for t in (h, w)]
    loss = chunked_loss.linear_cross_entropy(*got, y)
    (3.0 * loss).backward()  # a scale in front, as gradient accumulation puts one
    ref = plain(*want, y)
    (3.0 * ref).backward()
    assert torch.allclose(loss, ref, atol=1e-12)
    for g, r in zip(got, want):
        assert torch.allclose(g.grad, r.grad, atol=1e-12)


def test_all_positions_left_out_give_zero_loss_and_no_gradient():
    h, w = torch.randn(8, 4, requires_grad=True), torch.randn(10, 4, requires_grad=True)
    loss = chunked_loss.linear_cross_entropy(h, w, torch.full((8,), -100))
    loss.backward()
    assert loss.item() == 0.0 and not h.grad.any() and not w.grad.any()


def test_under_bf16_autocast_it_stays_close_to_the_float32_loss():
    torch.manual_seed(0)
    h, w, y = torch.randn(64, 32), torch.randn(100, 32) * 0.1, torch.randint(0, 100, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = chunked_loss.linear_cross_entropy(h, w, y)
    assert abs(loss.item() - plain(h, w, y).item()) < 0.05


def test_gpt_training_loss_and_gradients_equal_those_through_full_logits():
    torch.manual_seed(0)
    model = models.GPT(PlainArgs(n_layer=2, n_head=2, n_embd=32, block_size=16), 97)
    x, y = torch.randint(0, 97, (3, 16)), torch.randint(0, 97, (3, 16))
    logits, loss = model(x, y)
    assert logits is None  # in training the logits are never made whole
    loss.backward()
    chunked = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref = F.cross_entropy(F.linear(model.hidden(x), model.wte.weight).view(-1, 97), y.view(-1))
    ref.backward()
    assert abs(loss.item() - ref.item()) < 1e-5
    for n, p in model.named_parameters():
        assert torch.allclose(chunked[n], p.grad, atol=1e-6), n
    with torch.no_grad():
        logits, val = model(x, y)
    assert logits.shape == (3, 16, 97) and abs(val.item() - ref.item()) < 1e-5


def test_a_second_backward_through_a_kept_graph_gives_the_same_gradients():
    """backward hands over its saved gradients without a copy when the loss's gradient is 1: a kept graph
    must not see them changed by the first backward's accumulation."""
    torch.manual_seed(0)
    h, w, y = torch.randn(20, 8, requires_grad=True), torch.randn(30, 8, requires_grad=True), torch.randint(0, 30, (20,))
    loss = chunked_loss.linear_cross_entropy(h, w, y) + (w ** 2).sum()  # w gets a second gradient, summed in
    loss.backward(retain_graph=True)
    first = w.grad.clone()
    w.grad = None
    loss.backward()
    assert torch.equal(first, w.grad)
