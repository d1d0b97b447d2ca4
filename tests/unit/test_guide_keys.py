"""The RLM-mHC guide's training keys, its YAML config file and its data.train_path, as the trainer's config."""

from __future__ import annotations

import json
import subprocess

import pytest

from auralm.data import datadir
from auralm.training import command_line, config
from auralm.errors import UserError
from tests.trainer.helpers import PYTHON, REPO, prepare_data, python_env


def _get(cfg, key: str):
    if key.startswith("model.") and key != "model.name":  # a field of the model's args, as resolved
        return getattr(config.resolved_model(cfg.model), key.partition(".")[2])
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("override, key, value", [
    ("training.optimizer.lr=3e-4", "training.lr", 3e-4),
    ("training.optimizer.weight_decay=0.05", "training.weight_decay", 0.05),
    ("training.scheduler.warmup_steps=100", "training.warmup_steps", 100),
    ("training.scheduler.min_lr_ratio=0.2", "training.min_lr_ratio", 0.2),
    ("training.gradient_accumulation_steps=4", "training.grad_accum", 4),
    ("training.max_grad_norm=0.5", "training.grad_clip", 0.5),
    ("training.save_steps=500", "training.checkpoint_interval", 500),
    ("training.logging_steps=5", "training.log_interval", 5),
    ("training.mixed_precision=bf16", "training.dtype", "bf16"),
    ("training.mixed_precision=fp16", "training.dtype", "fp16"),
    ("training.mixed_precision=fp32", "training.dtype", "fp32"),
    ("training.mixed_precision=no", "training.dtype", "fp32"),
    ("training.gradient_checkpointing=true", "training.grad_checkpoint", True),
    ("training.dtype=fp16", "training.dtype", "fp16"),
    ("resume_from_checkpoint=runs/x/checkpoint-2", "resume", "runs/x/checkpoint-2"),
    ("+resume_from_checkpoint=runs/x/checkpoint-2", "resume", "runs/x/checkpoint-2"),
    ("resume_from_checkpoint=true", "resume", "latest"),
    ("data.train_path=corpus.jsonl", "data.train_path", "corpus.jsonl"),
    ("data.train_path=corpus.jsonl", "task", "lm"),  # text: the lm task unless task is given
    ("data.vocab_size=1000", "data.vocab_size", 1000),
    ("data.max_length=128", "model.block_size", 128),
])
def test_each_guide_key_sets_ours(override, key, value):
    given_task = [] if override.startswith("data.train_path") else ["task=lm"]
    cfg = command_line.parse(["model=rlm-tiny", *given_task, override])
    assert _get(cfg, key) == value


@pytest.mark.parametrize("text", ["[0.9,0.95]", "[0.9, 0.95]", "(0.9, 0.95)", "0.9,0.95"])
def test_betas_set_both_betas(text):
    cfg = command_line.parse([f"training.optimizer.betas={text}"])
    assert (cfg.training.beta1, cfg.training.beta2) == (0.9, 0.95)


@pytest.mark.parametrize("text, message", [
    ("0.9", "training.optimizer.betas='0.9': expected two numbers like [0.9,0.95]"),
    ("[0.9,0.95,0.99]", "expected two numbers like [0.9,0.95]"),
    ("[0.9,x]", "expected two numbers like [0.9,0.95]"),
    ("[0.9,0.95", "expected two numbers like [0.9,0.95]"),
    ("[0.9,1.5]", "training.beta2=1.5: must be in [0, 1)"),
])
def test_bad_betas_are_one_clear_error(text, message):
    with pytest.raises(UserError) as err:
        command_line.parse([f"training.optimizer.betas={text}"])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_optimizer_choice_still_works_beside_its_aliases():
    cfg = command_line.parse(["training.optimizer=adam_atan2", "training.optimizer.lr=1e-3",
                        "training.optimizer.betas=[0.8,0.9]"])
    assert (cfg.training.optimizer, cfg.training.lr, cfg.training.beta1, cfg.training.beta2) == \
        ("adam_atan2", 1e-3, 0.8, 0.9)


@pytest.mark.parametrize("override, message", [
    ("training.optimizer.learning_rate=1", "did you mean 'training.optimizer.lr'"),
    ("training.save_step=5", "did you mean 'training.save_steps'"),
    ("training.mixed_precison=fp16", "did you mean 'training.mixed_precision'"),
    ("resume_from_checkpoin=x", "did you mean 'resume_from_checkpoint'"),
    ("training.optimizer.beta=[0.9,0.95]", "did you mean 'training.optimizer.betas'"),
    ("data.train_pth=x.jsonl", "did you mean 'data.train_path'"),
    ("training.mixed_precision=fp8", "training.mixed_precision='fp8': expected bf16, fp16 or fp32 (or no)"),
    ("data.train_path=x.csv", "data.train_path=x.csv: expected a .jsonl file"),
])
def test_bad_guide_keys_name_the_problem(override, message):
    with pytest.raises(UserError) as err:
        command_line.parse([override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_train_path_with_another_task_is_refused():
    with pytest.raises(UserError, match="data.train_path is text for task=lm, not task=sudoku"):
        command_line.parse(["task=sudoku", "data.train_path=x.jsonl"])


GUIDE_YAML = """\
# as in the guide
model:
  name: rlm-tiny
  hidden_dim: 128
  num_layers: 2
  mhc_flows: 2
training:
  optimizer:
    lr: 3e-4
    weight_decay: 0.05
    betas: [0.9, 0.98]
  scheduler: {warmup_steps: 50, min_lr_ratio: 0.1}
  batch_size: 8
  gradient_accumulation_steps: 2
  mixed_precision: fp16
  gradient_checkpointing: true
data:
  train_path: corpus.jsonl
  max_length: 128
"""


def test_a_yaml_file_with_the_guides_nesting(tmp_path):
    f = tmp_path / "rlm.yaml"
    f.write_text(GUIDE_YAML)
    cfg = command_line.parse([f"config={f}"])
    arch = config.resolved_model(cfg.model)
    assert (cfg.task, cfg.model.name, arch.n_embd, arch.n_layer, arch.mhc_flows, arch.block_size) == \
        ("lm", "rlm-tiny", 128, 2, 2, 128)
    t = cfg.training
    assert (t.lr, t.weight_decay, t.beta1, t.beta2, t.warmup_steps, t.min_lr_ratio, t.batch_size, t.grad_accum,
            t.dtype, t.grad_checkpoint) == (3e-4, 0.05, 0.9, 0.98, 50, 0.1, 8, 2, "fp16", True)
    assert cfg.data.train_path == "corpus.jsonl"


def test_the_command_line_wins_over_the_file_whatever_the_order(tmp_path):
    f = tmp_path / "rlm.yaml"
    f.write_text(GUIDE_YAML)
    for args in (["training.optimizer.lr=1e-3", f"config={f}", "model.hidden_dim=64"],
                 [f"config={f}", "training.optimizer.lr=1e-3", "model.hidden_dim=64"]):
        cfg = command_line.parse(args)
        assert (cfg.training.lr, config.resolved_model(cfg.model).n_embd, cfg.training.batch_size) == \
            (1e-3, 64, 8)


def test_a_model_given_as_a_string_sets_the_size(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("model: rlm-tiny\ntask: lm\ntraining: {max_steps: 7, optimizer: adam_atan2}\n")
    cfg = command_line.parse([f"config={f}"])
    assert (cfg.model.name, cfg.training.max_steps, cfg.training.optimizer) == ("rlm-tiny", 7, "adam_atan2")


@pytest.mark.parametrize("content, message", [
    (None, "config={f}: no such file"),
    ("training:\n  lr: [1, 2\n  batch_size: 3\n", "config file {f}: not valid YAML at line 3"),
    ("- a\n- b\n", "config file {f}: expected a mapping of keys"),
    ("training:\n  optimizer:\n    lrr: 1e-3\n",
     "config file {f}: unknown key 'training.optimizer.lrr' (did you mean 'training.optimizer.lr'? the RLM-mHC "
     "guide's spelling of training.lr)"),
    ("training:\n  batch_size: many\n", "config file {f}: training.batch_size='many': expected an integer"),
])
def test_a_bad_config_file_is_one_error_naming_the_file(tmp_path, content, message):
    f = tmp_path / "bad.yaml"
    if content is not None:
        f.write_text(content)
    with pytest.raises(UserError) as err:
        command_line.parse(["model=rlm-tiny", f"config={f}"])
    assert message.format(f=f) in str(err.value) and "\n" not in str(err.value)


def test_the_check_path_reads_the_file_without_torch(tmp_path):
    f = tmp_path / "rlm.yaml"
    f.write_text(GUIDE_YAML)
    code = ("import sys; from auralm.training import command_line; command_line.parse_command_line(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    res = subprocess.run([PYTHON, "-c", code, f"config={f}", "training.max_steps=3"], capture_output=True,
                         text=True, timeout=60, env=python_env(), cwd=REPO)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([PYTHON, "-m", "auralm.training.command_line", f"config={tmp_path / 'none.yaml'}"],
                         capture_output=True, text=True, timeout=60, env=python_env(), cwd=REPO)
    assert res.returncode == 2 and res.stderr == f"error: config={tmp_path / 'none.yaml'}: no such file\n"


@pytest.mark.parametrize("line3, message", [
    ("{not json", "line 3: not JSON"),
    ('{"content": "no text field"}', "line 3: no 'text' string"),
    ('{"text": 42}', "line 3: no 'text' string"),
])
def test_a_bad_jsonl_line_is_one_error_naming_its_line(tmp_path, capsys, line3, message):
    src = tmp_path / "corpus.jsonl"
    good = [json.dumps({"text": f"línea número {i} del texto"}, ensure_ascii=False) for i in range(4)]
    src.write_text("\n".join(good[:2] + [line3] + good[2:]) + "\n")
    assert prepare_data([str(src), "--out", str(tmp_path / "out"), "--vocab-size", "300"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {src}, {message}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_train_path_is_prepared_beside_the_file_or_in_the_cache(tmp_path, monkeypatch):
    f = tmp_path / "c.jsonl"
    assert datadir.train_path_dir(f) == (tmp_path / "c.jsonl.auralm", False)
    monkeypatch.setattr(datadir.os, "access", lambda *a: False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    where, cached = datadir.train_path_dir(f)
    assert cached and where.parent == tmp_path / "cache" / "auralm" / "data" and where.name.startswith("c.jsonl-")
