"""HRM through the trainer: exact resume with its carry, two ranks whose rows halt differently, the NaN guard."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from auralm.training import config, train
from tests.trainer.helpers import by_step, records, run_ranks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(600)


def hrm_args(data_dir, out_dir, *extra):
    return [f"data_dir={data_dir}", f"out_dir={out_dir}", "model=hrm-tiny", "model.n_embd=32", "model.n_head=2",
            "logging.curves=false",
            "model.halt_max_steps=4", "model.halt_exploration_prob=0.5", "training.batch_size=8",
            "training.log_interval=1", "training.eval_interval=0", "training.checkpoint_interval=0",
            "training.warmup_steps=2", "training.dtype=fp32", *extra]


def test_resume_with_the_carry_continues_exactly_like_an_uninterrupted_run(sudoku_dir, tmp_path):
    torch.set_num_threads(1)
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    a = train.run(config.parse(hrm_args(sudoku_dir, whole, "training.max_steps=10", "training.checkpoint_interval=5",
                                        "training.ema=true")))
    ckpt = whole / "checkpoint-5"
    assert (ckpt / "carry.pt").exists() and (ckpt / "ema.pt").exists()
    b = train.run(config.parse(hrm_args(sudoku_dir, resumed, "training.max_steps=10", "training.ema=true",
                                        f"resume={ckpt}")))
    x, y = by_step(whole), by_step(resumed)
    assert sorted(y) == list(range(6, 11))
    for step in range(6, 11):
        assert x[step]["loss"] == pytest.approx(y[step]["loss"], abs=1e-6), step
        assert x[step]["ponder"] == y[step]["ponder"], step
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), n


def q_head_that_halts_by_input(run_dir, step: int) -> Path:
    """The run's checkpoint with a random Q-head, so rows halt at different segments from the first step on (a
    fresh model's Q-head halts no row before halt_max_steps); its checksums rewritten to match."""
    ckpt = run_dir / f"checkpoint-{step}"
    weights = safetensors.torch.load_file(ckpt / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    weights["core.q_head.weight"] = torch.randn(weights["core.q_head.weight"].shape, generator=g)
    weights["core.q_head.bias"] = torch.zeros(2)
    safetensors.torch.save_file(weights, ckpt / "model.safetensors")
    sums = json.loads((ckpt / "checksums.json").read_text())
    sums["model.safetensors"] = hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    (ckpt / "checksums.json").write_text(json.dumps(sums))
    return ckpt


def test_two_ranks_whose_rows_halt_at_different_segments_keep_identical_weights(sudoku_dir, tmp_path):
    torch.set_num_threads(1)
    train.run(config.parse(hrm_args(sudoku_dir, tmp_path / "start", "training.max_steps=1")))
    ckpt = q_head_that_halts_by_input(tmp_path / "start", 1)
    steps = 8
    r0, r1 = run_ranks(2, hrm_args(sudoku_dir, tmp_path / "run", f"training.max_steps={steps + 1}",
                                   f"resume={ckpt}"), tmp_path)
    assert r0["exit"] == r1["exit"] == 0, (r0.get("traceback"), r1.get("traceback"))
    assert r0["optimizer_steps"] == r1["optimizer_steps"] == steps
    assert len(r0["halted"]) == len(r1["halted"]) == steps  # one segment per step on every rank
    assert any(0 < sum(h) < len(h) for h in r0["halted"][1:])  # some rows halted early, others went on
    assert r0["halted"] != r1["halted"]  # ... though their rows halted at different segments
    for name, t in r0["state"].items():
        assert torch.equal(t, r1["state"][name]), name


def test_a_nan_on_one_rank_restores_every_rank_and_starts_the_carries_afresh(sudoku_dir, tmp_path):
    run = tmp_path / "run"
    results = run_ranks(2, hrm_args(sudoku_dir, run, "training.max_steps=12", "fault.nan_at_step=5-7",
                                    "fault.nan_rank=1", "guard.snapshot_every=2", "guard.max_bad=3"), tmp_path)
    assert all(r["exit"] == 0 for r in results), [r.get("traceback") for r in results]
    events = records(run, "events.jsonl")
    assert [(e["kind"], e["step"]) for e in events if e["kind"] in ("nan_skip", "recovery")] == [
        ("nan_skip", 5), ("nan_skip", 6), ("nan_skip", 7), ("recovery", 7)]
    assert next(e for e in events if e["kind"] == "recovery")["equal"]
    for r in results:  # after each skipped step every row of the carry starts afresh: all halted
        assert all(all(r["halted"][s]) for s in (5, 6, 7))
    for name, t in results[0]["state"].items():
        assert torch.equal(t, results[1]["state"][name]), name
    assert by_step(run)[12]["loss"] > 0
