"""DiLoCo's compressed rounds (auralm.parallel.compress): the block quantisation's error bound, int4's packing, the
remainder carried from round to round (nothing lost), and the bytes each kind sends."""

from __future__ import annotations

import pytest
import torch

from auralm.parallel.compress import BLOCK, Wire, dequantize, quantize, sent_per_round, slices


@pytest.mark.parametrize("kind, levels", [("int8", 127), ("int4", 7)])
@pytest.mark.parametrize("n", [1, BLOCK, 3 * BLOCK + 17])  # a partial block, and an odd count for int4's pairs
def test_each_value_comes_back_within_half_a_step_of_its_blocks_scale(kind, levels, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.logspace(-4, 1, n)  # blocks of very different magnitudes
    data = quantize(x, kind)
    assert data.dtype == torch.uint8 and data.shape == (-(-n // BLOCK), (BLOCK if kind == "int8" else BLOCK // 2) + 4)
    back = dequantize(data, kind, n)
    assert back.shape == x.shape
    for start in range(0, n, BLOCK):
        block = x[start:start + BLOCK]
        step = block.abs().max() / levels
        assert (back[start:start + BLOCK] - block).abs().max() <= step / 2 + 1e-12
    assert torch.equal(dequantize(quantize(torch.zeros(n), kind), kind, n), torch.zeros(n))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_what_the_rounding_leaves_out_is_sent_in_later_rounds(kind):
    """The decoded rounds sum to the payloads' sum minus the last remainder, which stays within one round's
    rounding: over many rounds the error does not grow."""
    n, rounds = 1000, 30
    wire = Wire(kind, n)
    g = torch.Generator().manual_seed(1)
    payloads = [torch.randn(n, generator=g) * 1e-3 for _ in range(rounds)]
    decoded = [wire.decode([wire.encode(p)]) for p in payloads]
    torch.testing.assert_close(sum(decoded) + wire.residual, sum(payloads), rtol=0, atol=1e-6)
    one_round = (payloads[-1] - Wire(kind, n).decode([Wire(kind, n).encode(payloads[-1])])).abs().max()
    assert wire.residual.abs().max() <= 3 * one_round
    without = sum(Wire(kind, n).decode([Wire(kind, n).encode(p)]) for p in payloads)  # no remainder carried
    assert (sum(decoded) - sum(payloads)).abs().max() < (without - sum(payloads)).abs().max()


def test_a_discarded_round_takes_its_remainder_back_and_a_restore_clears_it():
    wire = Wire("int8", 300)
    wire.encode(torch.randn(300))
    kept = wire.residual.clone()
    wire.encode(torch.randn(300))
    wire.undo()
    assert torch.equal(wire.residual, kept)
    state = wire.state_dict()
    wire.reset()
    assert wire.residual is None
    wire.load_state_dict(state)
    assert torch.equal(wire.residual, kept)


def test_none_and_bf16_are_summed_by_the_all_reduce_and_send_their_own_type():
    x = torch.randn(10)
    assert Wire("none", 10).summed and Wire("none", 10).encode(x).dtype == torch.float32
    assert Wire("bf16", 10).encode(x).dtype == torch.bfloat16 and not Wire("int8", 10).summed
    with pytest.raises(ValueError, match="expected one of none, bf16, int8, int4"):
        Wire("fp8", 10)


def test_the_bytes_a_rank_sends_a_round():
    p = 124_000_000  # the AuraLM guide's GPT-2
    bf16 = sent_per_round("bf16", p, 2)
    assert bf16 == 2 * p and sent_per_round("none", p, 2) == 4 * p and sent_per_round("bf16", p, 1) == 0
    assert 0.5 < sent_per_round("int8", p, 2) / bf16 < 0.51  # the codes and a scale per block
    assert 0.25 < sent_per_round("int4", p, 2) / bf16 < 0.26
    for world in (3, 4, 8):  # a reduce-scatter and an all-gather: the ring's 2(W-1)/W, like the all-reduce's
        assert sent_per_round("int8", p, world) / sent_per_round("bf16", p, world) == pytest.approx(0.508, abs=0.001)
    assert quantize(torch.zeros(p // 1000), "int8").numel() == pytest.approx(sent_per_round("int8", p // 1000, 2),
                                                                             abs=260)


def _round(wires: list[Wire], payloads: list[torch.Tensor]) -> torch.Tensor:
    """One round over len(wires) ranks as auralm.parallel.diloco sends it, without processes: each rank's records
    of each owner's blocks (the all-to-all), the owner's sum quantised again (the all-gather), decoded by all."""
    sent = [w.encode(p) for w, p in zip(wires, payloads)]
    bounds = slices(len(sent[0]), len(wires))
    parts = []
    for owner, (a, b) in enumerate(bounds):
        data, left_out = wires[owner].reduce([s[a:b] for s in sent])
        wires[owner].keep(left_out, a)
        parts.append(data)
    return wires[0].decode(parts)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_over_rounds_of_several_ranks_the_averages_and_the_remainders_hold_every_payload(kind, ranks):
    """Both roundings (each rank's, and each owner's of the sum) are carried: the decoded averages of all rounds
    plus every rank's remainder are exactly the sum of every payload; the remainders stay small."""
    n = 5 * BLOCK + 3
    wires = [Wire(kind, n) for _ in range(ranks)]
    g = torch.Generator().manual_seed(ranks)
    total_sent, total_got = torch.zeros(n), torch.zeros(n)
    for _ in range(20):
        payloads = [torch.randn(n, generator=g) * 1e-3 / ranks for _ in range(ranks)]
        total_sent += sum(payloads)
        total_got += _round(wires, payloads)
    torch.testing.assert_close(total_got + sum(w.residual for w in wires), total_sent, rtol=0, atol=1e-6)
    step = 1e-3 * 4 / (127 if kind == "int8" else 7)  # about a block's largest value over the levels
    assert all(w.residual.abs().max() < 4 * step for w in wires)
