"""HRM and TRM: the one-step gradient, the detached carry, ACT halting and its Q targets, gradient checkpointing."""

from __future__ import annotations

import pytest
import torch

from auralm import models
from auralm.training import config
from auralm.models.act import ACT, Level


def build(name: str, task: str = "sudoku", vocab: int | None = None, **over) -> ACT:
    arch = config.SIZES[name].replace(n_embd=32, n_head=2, **over)
    torch.manual_seed(0)
    return models.build(task, arch, vocab)


def sudoku_batch(b: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 10, (b, 81), generator=g)
    y = torch.randint(0, 9, (b, 81), generator=g)
    return x, y


def count_level_calls(model: ACT):
    """(calls of each Level, calls with gradient enabled), recorded by forward hooks."""
    calls: dict[str, list[bool]] = {}
    for name, m in model.named_modules():
        if isinstance(m, Level):
            m.register_forward_hook(lambda mod, i, o, name=name: calls.setdefault(name, []).append(
                torch.is_grad_enabled()))
    return calls


@pytest.mark.parametrize("H_cycles, L_cycles", [(2, 2), (3, 4)])
def test_hrm_runs_every_update_but_the_last_L_and_H_without_gradient(H_cycles, L_cycles):
    model = build("hrm-tiny", H_cycles=H_cycles, L_cycles=L_cycles)
    calls = count_level_calls(model)
    x, y = sudoku_batch()
    z, logits, q = model.core(model.core.initial_states(6, 81), x)
    assert calls["core.L"].count(True) == 1 and len(calls["core.L"]) == H_cycles * L_cycles
    assert calls["core.H"].count(True) == 1 and len(calls["core.H"]) == H_cycles
    assert calls["core.L"][-1] and calls["core.H"][-1]  # the gradient flows through the last ones
    assert all(not s.requires_grad for s in z)  # the carried state is detached between segments
    assert logits.requires_grad and logits.shape == (6, 81, 9) and q.shape == (6, 2)


def test_trm_backpropagates_through_the_last_cycle_only():
    T, n = 3, 4
    model = build("trm-tiny", H_cycles=T, L_cycles=n)
    calls = count_level_calls(model)
    x, _ = sudoku_batch()
    model.core(model.core.initial_states(6, 81), x)
    assert len(calls["core.net"]) == T * (n + 1) and calls["core.net"].count(True) == n + 1
    assert calls["core.net"][-(n + 1):] == [True] * (n + 1)


@pytest.mark.slow  # 11-12 s of CPU measured: not in scripts/test.sh --fast
def test_the_memory_of_a_segment_does_not_grow_with_the_cycles():
    """What autograd keeps for the backward is the same at 2 cycles as at 6: only the last updates are in the graph."""
    saved = []
    for cycles in (2, 6):
        model = build("hrm-tiny", H_cycles=cycles, L_cycles=cycles)
        x, y = sudoku_batch()
        carry = model.initial_carry(x, y)
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            carry, logits, q, target = model(carry, x, y)
            loss, _ = model.loss(carry, logits, q, target)
        loss.backward()
        assert all(p.grad is not None for n, p in model.named_parameters() if "puzzle" not in n)
        saved.append(sum(sizes))
    assert saved[0] == saved[1] > 0


def test_q_head_starts_at_continue_and_rows_halt_at_the_step_limit():
    model = build("hrm-tiny", halt_max_steps=3, halt_exploration_prob=0.0)
    model.train()
    x, y = sudoku_batch()
    carry = model.initial_carry(x, y)
    halted = []
    for _ in range(4):
        carry, *_ = model(carry, x, y)
        halted.append(carry.halted.tolist())
    # q_halt == q_continue == -5 at init: nobody halts before the limit; all do at 3; then a fresh start
    assert halted == [[False] * 6, [False] * 6, [True] * 6, [False] * 6]
    assert carry.steps.tolist() == [1] * 6


def test_rows_halt_when_q_halt_wins_unless_exploration_holds_them():
    model = build("hrm-tiny", halt_max_steps=8, halt_exploration_prob=0.0)
    with torch.no_grad():
        model.core.q_head.bias.copy_(torch.tensor([3.0, -3.0]))  # q_halt > q_continue for every row
    x, y = sudoku_batch()
    carry, *_ = model(model.initial_carry(x, y), x, y)
    assert carry.halted.all()
    model.exploration = 1.0  # every row must first run 2..8 segments
    carry, *_ = model(model.initial_carry(x, y), x, y)
    assert not carry.halted.any()
    model.eval()  # evaluation ignores the Q-head: all halt_max_steps segments
    carry, *_ = model(model.initial_carry(x, y), x, y)
    assert not carry.halted.any()


def test_trm_halts_on_q_halt_alone():
    model = build("trm-tiny", halt_max_steps=8, halt_exploration_prob=0.0)
    x, y = sudoku_batch()
    with torch.no_grad():
        model.core.q_head.bias.copy_(torch.tensor([0.5, 9.0]))  # q_halt > 0, though q_continue is larger
    carry, _, _, target = model(model.initial_carry(x, y), x, y)
    assert carry.halted.all() and target is None


def test_q_continue_target_is_the_next_segments_best_q_and_q_halt_at_the_last_step():
    model = build("hrm-tiny", halt_max_steps=2, halt_exploration_prob=0.0)
    a, b = -1.0, 0.5  # with zero weights the Q-head gives (a, b) for any state
    with torch.no_grad():
        model.core.q_head.bias.copy_(torch.tensor([a, b]))
    x, y = sudoku_batch()
    carry, _, _, target = model(model.initial_carry(x, y), x, y)
    assert torch.allclose(target, torch.sigmoid(torch.tensor(max(a, b))).expand(6))
    carry, _, _, target = model(carry, x, y)  # step 2 of 2: the last
    assert torch.allclose(target, torch.sigmoid(torch.tensor(a)).expand(6))


def test_q_halt_learns_whether_the_whole_answer_is_right():
    model = build("hrm-tiny")
    x, y = sudoku_batch(2)
    carry, logits, q, target = model(model.initial_carry(x, y), x, y)
    perfect = torch.nn.functional.one_hot(carry.y, 9).float() * 50  # row 0 all right, row 1 one cell wrong
    perfect[1, 0] = perfect[1, 0].roll(1)
    q = torch.zeros(2, 2)
    _, m = model.loss(carry, perfect, q, None)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    assert torch.isclose(m["q_halt_loss"], bce(torch.zeros(2), torch.tensor([1.0, 0.0])))


@pytest.mark.parametrize("name", ["hrm-tiny", "trm-tiny"])
def test_a_float64_model_rounds_nowhere_to_float32_and_explores_with_the_draws_of_its_type(name):
    """The casts of the models are "float32 or wider" (bench/reference_check.py --dtype float64 compares two
    implementations with float32 rounding out of the way): a float64 model's Q logits, losses and gradients are
    float64. Its exploration draws rand in q's type, as the public code's rand_like: in a float64 model the rows held
    are those of torch.rand(B, dtype=float64) from the same seed, which float32 draws would not all match."""
    model = build(name, halt_max_steps=8, halt_exploration_prob=0.5).double()
    model.train()
    x, y = sudoku_batch(64)
    with torch.no_grad():
        model.core.q_head.bias.copy_(torch.tensor([9.0, -9.0]))  # every row would halt, but for exploration
    torch.manual_seed(3)
    carry, logits, q, target = model(model.initial_carry(x, y), x, y)
    torch.manual_seed(3)
    held = torch.rand(64, dtype=torch.float64) < 0.5
    assert q.dtype == logits.dtype == torch.float64
    assert torch.equal(~carry.halted, held)  # a held row runs 2 segments at least: none halts at its first
    loss, m = model.loss(carry, logits, q, target)
    assert loss.dtype == torch.float64
    loss.backward()
    assert all(p.grad.dtype == torch.float64 for p in model.parameters() if p.grad is not None)
    torch.manual_seed(3)
    assert not torch.equal(held, torch.rand(64) < 0.5)  # float32 draws differ: the test can tell them apart


def test_halted_rows_take_the_fresh_example_and_a_reset_state_others_keep_theirs():
    model = build("hrm-tiny", halt_max_steps=4, halt_exploration_prob=0.0)
    x1, y1 = sudoku_batch(seed=1)
    x2, y2 = sudoku_batch(seed=2)
    carry, *_ = model(model.initial_carry(x1, y1), x1, y1)
    carry.halted = torch.tensor([True, False, True, False, False, False])
    new, *_ = model(carry, x2, y2)
    for row in range(6):
        want = x2 if carry.halted[row] else x1
        assert torch.equal(new.x[row], want[row])
    assert new.steps.tolist() == [1, 2, 1, 2, 2, 2]


def test_eval_reports_the_q_heads_own_halting_segment():
    model = build("hrm-tiny", halt_max_steps=4)
    qs = torch.tensor([[[-1.0, 0.0], [2.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]],
                       [[0.0, 0.0], [0.0, 0.0]]])  # (segments, rows, 2)
    assert model.halt_index(qs).tolist() == [1, 0]


@pytest.mark.parametrize("name", ["hrm-tiny", "trm-tiny"])
def test_gradient_checkpointing_gives_the_same_gradients(name):
    grads = []
    for on in (False, True):
        model = build(name)
        model.set_grad_checkpointing(on)
        x, y = sudoku_batch()
        carry = model.initial_carry(x, y)
        for _ in range(2):  # the second segment starts from a carried state
            carry, logits, q, target = model(carry, x, y)
        loss, _ = model.loss(carry, logits, q, target)
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-6), n


def test_causal_hrm_on_text_does_not_see_the_future():
    model = build("hrm-tiny", task="lm", vocab=50, pos_encodings="rope", block_size=16)
    model.eval()
    x = torch.randint(0, 50, (1, 16))
    x2 = x.clone()
    x2[0, 10:] = (x2[0, 10:] + 1) % 50
    p1 = model.solve(x)[2]
    p2 = model.solve(x2)[2]
    assert torch.allclose(p1[0, :10], p2[0, :10], atol=1e-5)
    assert not torch.allclose(p1[0, 10:], p2[0, 10:], atol=1e-5)


@pytest.mark.slow  # 11-12 s of CPU measured: not in scripts/test.sh --fast
def test_trm_mlp_t_and_the_paper_sizes_build():
    for name in ("trm-5m-mlp", "trm-7m", "hrm-27m"):
        arch = config.resolved_model(config.ModelConfig(name=name))
        model = models.build("sudoku", arch)
        n = sum(p.numel() for p in model.parameters())
        assert {"trm-5m-mlp": 4e6, "trm-7m": 6e6, "hrm-27m": 25e6}[name] < n < {
            "trm-5m-mlp": 7e6, "trm-7m": 8e6, "hrm-27m": 29e6}[name], (name, n)
