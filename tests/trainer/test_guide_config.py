"""A run typed as the RLM-mHC guide types it: its YAML file, its keys, data.train_path=FILE.jsonl prepared by the
trainer, fp16 with a GradScaler, and +resume_from_checkpoint continuing exactly like an uninterrupted run."""

from __future__ import annotations

import functools
import json

import pytest
import safetensors.torch
import torch

from auralm.training import train
from tests.trainer.helpers import QUIJOTE, by_step, records, run_ranks

MODEL = ["model=rlm-tiny", "model.hidden_dim=64", "model.num_layers=2", "model.num_heads=2", "model.head_dim=32",
         "model.ffn_dim=128", "model.max_seq_len=64"]
GUIDE_YAML = """\
training:
  optimizer: {lr: 1e-3, weight_decay: 0.1, betas: [0.9, 0.95]}
  scheduler: {warmup_steps: 2, min_lr_ratio: 0.1}
  batch_size: 4
  max_steps: 100        # the command line's training.max_steps wins
  mixed_precision: fp16
  save_steps: 2
  logging_steps: 1
  eval_interval: 0
  sample_tokens: 0
data:
  train_path: {jsonl}
  vocab_size: 512
"""


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def guide(tmp_path):
    """The guide's config file and a JSONL corpus of Don Quijote's paragraphs (one {"text": ...} a line)."""
    paragraphs = [p.replace("\n", " ").strip() for p in QUIJOTE.read_text(encoding="utf-8").split("\n\n")]
    corpus = tmp_path / "corpus" / "quijote.jsonl"
    corpus.parent.mkdir()
    corpus.write_text("".join(json.dumps({"text": p}, ensure_ascii=False) + "\n"
                              for p in paragraphs[40:340] if len(p) > 40), encoding="utf-8")
    f = tmp_path / "guide.yaml"
    f.write_text(GUIDE_YAML.replace("{jsonl}", str(corpus)))
    return f, corpus


def test_the_guides_command_line_trains_in_fp16_and_resumes_exactly(guide, tmp_path, capsys, monkeypatch):
    # This model's scaled gradients overflow float16 at the default first scale (2**16) and fit at 2**15. From 2**17
    # the scaler skips steps 1 and 2, halving its scale each time: the NaN guard counts nothing, checkpoint-2 keeps
    # 2**15, and the resumed run must restore it (from 2**17 again its step 3 would be skipped too).
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(torch.amp.GradScaler, init_scale=2.0 ** 17))
    cfg_file, corpus = guide
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    common = [f"config={cfg_file}", *MODEL, "training.max_steps=4"]
    assert train.main([*common, f"out_dir={whole}"]) == 0
    out = capsys.readouterr().out
    prepared = corpus.parent / "quijote.jsonl.auralm"
    assert f"data.train_path={corpus}: wrote " in out and f"to {prepared}" in out
    assert (prepared / "meta.json").exists() and (prepared / "tokenizer").is_dir()

    a = by_step(whole)
    assert sorted(a) == [1, 2, 3, 4]
    assert [a[s]["grad_norm"] > 0 for s in (1, 2, 3, 4)] == [False, False, True, True]  # the scaler's skips: 0
    assert not [e for e in records(whole, "events.jsonl") if e["kind"] in ("nan_skip", "recovery")]
    scaler = torch.load(whole / "checkpoint-2" / "grad_scaler.pt", weights_only=True)
    assert scaler["scale"] == 2.0 ** 15
    saved = json.loads((whole / "config.json").read_text())
    assert (saved["task"], saved["training"]["dtype"], saved["training"]["max_steps"], saved["data_dir"]) == \
        ("lm", "fp16", 4, str(prepared))

    assert train.main([*common, f"out_dir={resumed}", f"+resume_from_checkpoint={whole / 'checkpoint-2'}"]) == 0
    out = capsys.readouterr().out
    assert f"data.train_path={corpus}: up to date: {prepared}" in out
    assert f"resuming from {whole / 'checkpoint-2'} (step 2)" in out
    b = by_step(resumed)
    assert sorted(b) == [3, 4]
    for step in (3, 4):
        assert (a[step]["loss"], a[step]["grad_norm"]) == (b[step]["loss"], b[step]["grad_norm"]), step
    x = safetensors.torch.load_file(str(whole / "checkpoint-4" / "model.safetensors"))
    y = safetensors.torch.load_file(str(resumed / "checkpoint-4" / "model.safetensors"))
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def test_a_bad_jsonl_line_stops_the_run_with_one_line(guide, tmp_path, capsys):
    cfg_file, corpus = guide
    lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    corpus.write_text("".join(lines[:2] + ['{"texto": "sin el campo"}\n'] + lines[3:]), encoding="utf-8")
    assert train.main([f"config={cfg_file}", *MODEL, f"out_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {corpus}, line 3: no 'text' string (each line must be one object like " \
                  f"{{\"text\": \"...\"}})\n"


def test_on_two_ranks_local_rank_0_prepares_and_the_other_waits(guide, tmp_path):
    """Rank 1 is local rank 1 of the same node: it must wait at the barrier until rank 0 has prepared the file
    (reading the data directory earlier would find no meta.json). fp16 under DDP: the same weights on both."""
    cfg_file, corpus = guide
    r0, r1 = run_ranks(2, [f"config={cfg_file}", *MODEL, "training.max_steps=2", "backend=gloo",
                           f"out_dir={tmp_path / 'run'}"], tmp_path / "ranks", timeout=120,
                       env=[{}, {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}])
    assert r0["exit"] == r1["exit"] == 0, (r0.get("traceback"), r1.get("traceback"))
    assert (corpus.parent / "quijote.jsonl.auralm" / "meta.json").exists()
    x, y = r0["state"], r1["state"]
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


FINETUNE_YAML = """\
# the RLM guide's finetune.yaml, over the base config: the optimizer's and the scheduler's types, and W&B
training:
  optimizer: {type: adamw, lr: 1.0e-3, weight_decay: 0.01}
  scheduler: {type: linear}
  wandb: {project: rlm-finetune, entity: aura-lab}
  max_steps: 6
  mixed_precision: "no"
"""


def test_the_finetune_yaml_trains_with_its_schedule_and_its_wandb_project(guide, tmp_path, monkeypatch, capsys):
    pytest.importorskip("wandb")
    from tests.unit.test_tracking import wandb_offline_records

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    base, _ = guide
    f = tmp_path / "finetune.yaml"
    f.write_text(FINETUNE_YAML)
    run = tmp_path / "run"
    assert train.main([f"config={base}", f"config={f}", *MODEL[1:], f"out_dir={run}"]) == 0  # no model=: its keys
    out = capsys.readouterr().out
    assert "model: rlm-tiny (RLM), chosen from model.hidden_dim=64" in out.splitlines()
    lr = {s: r["lr"] for s, r in by_step(run).items()}
    expected = {1: 5e-4, 2: 1e-3, 3: 7.75e-4, 4: 5.5e-4, 5: 3.25e-4, 6: 1e-4}  # warmup, then a straight line
    assert sorted(lr) == sorted(expected) and all(abs(lr[s] - e) < 1e-9 for s, e in expected.items()), lr
    [wandb_dir] = (tmp_path / "wb" / "wandb").glob("offline-run-*")
    run_id = (run / "wandb-run-id").read_text().strip()
    runs = [r.run for r in wandb_offline_records(wandb_dir / f"run-{run_id}.wandb") if r.WhichOneof("record_type") == "run"]
    assert runs and (runs[0].project, runs[0].entity) == ("rlm-finetune", "aura-lab")
