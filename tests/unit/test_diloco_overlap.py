"""DiLoCo's overlap (training.diloco.overlap_steps): the local steps taken while a round travels are kept."""

from __future__ import annotations

import torch

from auralm.training.config import DilocoConfig
from auralm.training.distributed import Dist
from auralm.parallel.diloco import DiLoCo


def _setup(lr: float, momentum: float):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    outer = DiLoCo(model, DilocoConfig(outer_lr=lr, outer_momentum=momentum, compress="none"), Dist(), 1.0)
    start = [p.detach().clone() for p in model.parameters()]
    return model, outer, start


def _step(model, seed: int) -> list[torch.Tensor]:
    """A local 'step': some change to every weight; returns the change."""
    gen = torch.Generator().manual_seed(seed)
    change = [torch.randn(p.shape, generator=gen) * 0.1 for p in model.parameters()]
    with torch.no_grad():
        for p, c in zip(model.parameters(), change):
            p.add_(c)
    return change


def test_the_steps_taken_while_a_round_travels_land_on_top_of_the_new_shared_weights():
    model, outer, start = _setup(0.7, 0.9)
    round_change = _step(model, 1)
    outer.start(0, 1.0, 1, carry=True)
    meanwhile = [a + b for a, b in zip(_step(model, 2), _step(model, 3))]  # two local steps of the next round
    assert outer.finish().ok
    # a world of one: the pseudo-gradient is -r, and Nesterov's first step moves by lr * (1 + momentum) of it
    shared = [s + 0.7 * 1.9 * r for s, r in zip(start, round_change)]
    for got, want in zip(outer.shared, shared):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    for p, want, m in zip(model.parameters(), shared, meanwhile):
        torch.testing.assert_close(p.detach(), want + m, rtol=1e-6, atol=1e-7)


def test_finishing_before_any_step_is_bit_for_bit_the_round_without_overlap():
    results = []
    for carry in (False, True):
        model, outer, _ = _setup(0.7, 0.9)
        _step(model, 1)
        outer.start(0, 1.0, 1, carry=carry)
        outer.finish()
        _step(model, 2)
        outer.start(0, 1.0, 1, carry=carry)
        outer.finish()
        results.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_a_broken_round_drops_the_steps_taken_meanwhile_too():
    model, outer, start = _setup(1.0, 0.0)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    outer.start(0, 1.0, 1, carry=True)
    _step(model, 2)
    rnd = outer.finish()
    assert not rnd.ok and rnd.broken == [0]
    assert all(torch.equal(p.detach(), s) for p, s in zip(model.parameters(), start))


def test_fragments_are_runs_of_consecutive_tensors_of_about_equal_size():
    from auralm.parallel.diloco_strategy import fragments

    params = [torch.zeros(n) for n in (10, 30, 20, 20, 5, 15)]  # 100 elements
    sizes = lambda parts: [sum(t.numel() for t in part) for part in parts]  # noqa: E731
    assert sizes(fragments(params, 1)) == [100]
    assert sizes(fragments(params, 2)) == [60, 40]  # a part ends once it reaches its share
    assert sizes(fragments(params, 4)) == [40, 20, 20, 20]
    assert [len(p) for p in fragments(params, 6)] == [1] * 6
    assert len(fragments(params, 9)) == 6  # no part without a tensor
    assert [t for part in fragments(params, 3) for t in part] == params  # every tensor once, in order
