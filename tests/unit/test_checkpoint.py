"""Checkpoints: whole or absent, pruned to the last N plus the best, a corrupt one detected."""

from __future__ import annotations

import json

import torch

from auralm.training import checkpoint


def _save(run_dir, step, val_loss, keep_last=2):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return checkpoint.save(run_dir, step, model, opt, [{"torch": torch.get_rng_state()}],
                           {"val_loss": val_loss, "config": {}}, keep_last)


def test_keeps_the_last_n_and_the_best(tmp_path):
    for step, val in [(10, 1.0), (20, 0.5), (30, 0.9), (40, 0.8), (50, 0.7)]:
        _save(tmp_path, step, val)
    assert [checkpoint.step_of(c) for c in checkpoint.list_checkpoints(tmp_path)] == [50, 40, 20]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_a_whole_checkpoint_loads_back(tmp_path):
    ckpt = _save(tmp_path, 5, None)
    assert checkpoint.problem(ckpt) is None
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    checkpoint.load_weights(ckpt, model, opt)
    state, rng = checkpoint.read_state(ckpt)
    assert state["step"] == 5 and len(rng) == 1
    assert opt.state_dict()["state"][0]["step"].item() == 1


def test_a_truncated_or_incomplete_checkpoint_is_detected_and_the_previous_is_next(tmp_path):
    for step in (10, 20, 30):
        _save(tmp_path, step, None, keep_last=5)
    latest = tmp_path / "checkpoint-30"
    data = (latest / "model.safetensors").read_bytes()
    (latest / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "model.safetensors does not match its checksum" in checkpoint.problem(latest)
    (tmp_path / "checkpoint-20" / "checksums.json").unlink()  # a directory left half-written by hand
    assert "checksums.json" in checkpoint.problem(tmp_path / "checkpoint-20")
    assert [checkpoint.step_of(c) for c in checkpoint.candidates(tmp_path)] == [30, 20, 10]
    assert [checkpoint.step_of(c) for c in checkpoint.candidates(latest)] == [30, 20, 10]
    assert [checkpoint.step_of(c) for c in checkpoint.candidates(tmp_path / "checkpoint-20")] == [20, 10]


def test_an_interrupted_save_leaves_only_a_hidden_temporary(tmp_path):
    _save(tmp_path, 10, None)
    (tmp_path / ".checkpoint-20.tmp").mkdir()  # what a crash during the save of step 20 leaves
    assert [c.name for c in checkpoint.list_checkpoints(tmp_path)] == ["checkpoint-10"]
    assert json.loads((tmp_path / "checkpoint-10" / "state.json").read_text())["step"] == 10
