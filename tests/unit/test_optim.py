"""The trainer's optimizers (auralm.training.optim.uncompiled): torch's AdamW and SGD, the same arithmetic, stepped
without torch.compile's marks, so that they do not import the compiler (torch._dynamo, 1.1 s of CPU at a rank's start;
DDP's constructor imports it anyway, a single process or DiLoCo's ranks need not)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from auralm.training import optim
from tests.trainer.helpers import python_env, tiny_args

CASES = [(optim.AdamW, torch.optim.AdamW, {"lr": 1e-2, "betas": (0.9, 0.95)}),
         (optim.SGD, torch.optim.SGD, {"lr": 0.7, "momentum": 0.9, "nesterov": True})]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))


def _groups(model: torch.nn.Module) -> list[dict]:
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def _steps(model, opt, x, n: int) -> None:
    for _ in range(n):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("ours, theirs, kwargs", CASES, ids=["AdamW", "SGD-nesterov"])
def test_each_step_equals_torchs_bit_for_bit_and_runs_the_step_hooks(ours, theirs, kwargs):
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1))
    a, b = _model(), _model()
    mine, torchs = ours(_groups(a), **kwargs), theirs(_groups(b), **kwargs)
    stepped = []
    handle = register_optimizer_step_post_hook(lambda opt, args, kw: stepped.append(opt))
    try:
        _steps(a, mine, x, 4)
        _steps(b, torchs, x, 4)
    finally:
        handle.remove()
    assert [o is mine for o in stepped] == [True] * 4 + [False] * 4  # each step once, torch's profiler hook kept
    assert torch.is_grad_enabled()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    # its state as torch's: saved, loaded into a fresh one, the next steps still equal
    again = ours(_groups(a), **kwargs)
    again.load_state_dict(mine.state_dict())
    assert again.state_dict()["state"].keys() == torchs.state_dict()["state"].keys()
    _steps(a, again, x, 2)
    _steps(b, torchs, x, 2)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert isinstance(mine, theirs) and type(mine).__name__ == theirs.__name__


def test_a_training_run_and_an_outer_step_never_import_the_compiler(sudoku_data, tmp_path):
    """The trainer itself (a tiny sudoku run: AdamW's steps, gradient clipping, a checkpoint with the optimizer's
    state) and then DiLoCo's outer SGD, in a fresh process."""
    args = tiny_args(sudoku_data(200), tmp_path / "run", "training.max_steps=3", "training.checkpoint_interval=3")
    code = ("import sys, torch\n"
            "from auralm.training import train, optim\n"
            f"assert train.main({args!r}) == 0\n"
            "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
            "outer = optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True); outer.step(); outer.zero_grad()\n"
            "outer.load_state_dict(outer.state_dict())\n"
            "print('compiler imported:', 'torch._dynamo' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=python_env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert [p.name for p in (tmp_path / "run").rglob("checkpoint-*")] == ["checkpoint-3"]
    assert res.stdout.splitlines()[-1] == "compiler imported: False", res.stdout[-1000:]
