"""The trainer's optimizers (auralm.training.optim.uncompiled): torch's AdamW and SGD, the same arithmetic, stepped
without torch.compile's marks, so that they do not import the compiler (torch._dynamo, 1.1 s of CPU at a rank's
start); nor does DDP's constructor (auralm.training.compiler.ddp_mode_read)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from auralm.training import optim
from tests.trainer.helpers import free_port, python_env, records, tiny_args

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


def test_a_ddp_run_and_an_outer_step_never_import_the_compiler(sudoku_data, tmp_path):
    """The trainer on two ranks, each a fresh process as torchrun starts them (DDP's constructor and forwards,
    AdamW's steps, gradient clipping, a checkpoint with the optimizer's state), then DiLoCo's outer SGD on each."""
    args = tiny_args(sudoku_data(200), tmp_path / "run", "training.max_steps=3", "training.checkpoint_interval=3")
    code = ("import sys, torch\n"
            "from auralm.training import train, optim\n"
            f"assert train.main({args!r}) == 0\n"
            "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3)\n"
            "outer = optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True); outer.step(); outer.zero_grad()\n"
            "outer.load_state_dict(outer.state_dict())\n"
            "print('compiler imported:', 'torch._dynamo' in sys.modules)\n"
            "print('matplotlib imported:', 'matplotlib' in sys.modules)\n")
    world = dict(WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(free_port()))
    ranks = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=python_env(RANK=str(r), **world)) for r in range(2)]
    try:  # one rank failing leaves the other waiting for it: killed below, not left behind
        for rank in ranks:
            out, err = rank.communicate(timeout=300)
            assert rank.returncode == 0, err[-2000:]
            assert out.splitlines()[-2:] == ["compiler imported: False", "matplotlib imported: False"], out[-1000:]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
                rank.communicate()
    assert [p.name for p in (tmp_path / "run").rglob("checkpoint-*")] == ["checkpoint-3"]
    assert not (tmp_path / "run" / "curves.png").exists()  # logging.curves=false (tiny_args): no picture drawn
    checksums = [e for e in records(tmp_path / "run", "events.jsonl") if e["kind"] == "checksum"]
    assert len(checksums[0]["checksums"]) == 2 and checksums[0]["equal"], checksums  # two ranks, in step
