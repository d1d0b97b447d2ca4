"""The trainer's config: key=value overrides, the nearest key for a typo, and `--check`."""

from __future__ import annotations

import subprocess

import pytest

from auralm.training import command_line, config
from auralm.errors import UserError
from tests.trainer.helpers import PYTHON, REPO, python_env


def test_overrides_set_nested_fields_and_the_named_size():
    cfg = command_line.parse(["model=tiny", "model.n_layer=3", "training.batch_size=8", "training.grad_checkpoint=true",
                        "fault.nan_at_step=3,10-12", "backend=gloo", "task=lm"])
    resolved = config.to_dict(cfg)
    assert resolved["model"] == {"name": "tiny", "n_layer": 3, "n_head": 2, "n_embd": 64, "block_size": 64,
                                 "dropout": 0.0}
    assert cfg.training.batch_size == 8 and cfg.training.grad_checkpoint is True
    assert cfg.fault.nan_at_step == (3, 10, 11, 12)
    assert (cfg.backend, cfg.task) == ("gloo", "lm")


def test_defaults_are_the_embedded_sudoku_run():
    cfg = command_line.parse([])
    assert cfg.task == "sudoku" and cfg.resume == "" and cfg.backend == "auto"


@pytest.mark.parametrize("override, expected", [
    ("training.batchsize=8", "did you mean 'training.batch_size'"),
    ("modl.n_layer=2", "did you mean 'model.n_layer'"),
    ("fault.nan_step=3", "did you mean 'fault.nan_at_step'"),
    ("training.lr=fast", "training.lr='fast': expected a number"),
    ("training.max_steps=0", "training.max_steps=0: must be greater than 0"),
    ("model=huge", "model='huge': expected one of tiny, mini, small, 124m, hrm-tiny"),
    ("backend=mpi", "backend='mpi': expected one of auto, nccl, gloo"),
    ("fault.nan_at_step=9-3", "expected steps like 10,11,12 or 10-14"),
    ("model.n_embd=65", "not a multiple of model.n_head"),
    ("max_steps", "expected key=value"),
    ("fault.step_sleep=-0.1", "fault.step_sleep=-0.1: must not be negative"),
    ("training.diloco.inner_steps=often", "training.diloco.inner_steps='often': expected an integer or auto"),
])
def test_bad_overrides_name_the_problem(override, expected):
    with pytest.raises(UserError, match=None) as err:
        command_line.parse([override])
    assert expected in str(err.value)


def test_diloco_inner_steps_auto_is_rounds_by_time_of_h_steps():
    d = command_line.parse(["training.sync=diloco", "training.diloco.inner_steps=auto"]).training.diloco
    assert d.timed and d.inner_steps == config.DilocoConfig().inner_steps  # H: the schedule's steps a round
    d = command_line.parse(["training.diloco.inner_steps=auto", "training.diloco.inner_steps=20"]).training.diloco
    assert d.timed and d.inner_steps == 20
    assert not command_line.parse(["training.sync=diloco"]).training.diloco.timed


def _train_cli(*args):
    return subprocess.run([PYTHON, "-m", "auralm.training.train", *args], capture_output=True, text=True, timeout=120,
                          env=python_env(), cwd=REPO)


def test_check_accepts_good_overrides_and_touches_nothing(tmp_path):
    res = subprocess.run([PYTHON, "-m", "auralm.training.train", "--check", "model=tiny", "training.max_steps=5",
                          f"data_dir={tmp_path}/none"], capture_output=True, text=True, timeout=120,
                         env=python_env(), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert list(tmp_path.iterdir()) == []  # no data generated, no run directory


def test_check_rejects_a_typo_in_one_line_with_exit_2():
    res = _train_cli("--check", "training.max_step=5")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: unknown key 'training.max_step' (did you mean 'training.max_steps'?)"]


def test_unknown_option_is_one_line():
    res = _train_cli("--check", "--fast")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("error: unknown option --fast")


def test_a_line_pasted_from_the_hrm_guide_parses_into_our_keys():
    cfg = command_line.parse("model=hrm-27m data_path=data/sudoku-extreme-1k-aug-1000 epochs=20000 eval_interval=2000 "
                       "global_batch_size=384 lr=7e-5 puzzle_emb_lr=7e-5 weight_decay=1.0 "
                       "puzzle_emb_weight_decay=1.0 arch.L_cycles=8 arch.halt_max_steps=8".split())
    t = cfg.training
    assert cfg.data_dir == "data/sudoku-extreme-1k-aug-1000"
    assert (t.epochs, t.eval_every_epochs, t.global_batch_size) == (20000, 2000, 384)
    assert (t.lr, t.puzzle_emb_lr, t.weight_decay, t.puzzle_emb_weight_decay) == (7e-5, 7e-5, 1.0, 1.0)
    arch = config.resolved_model(cfg.model)
    assert (arch.family, arch.n_embd, arch.L_cycles, arch.halt_max_steps) == ("hrm", 512, 8, 8)


def test_a_line_pasted_from_the_trm_guide_parses_into_our_keys():
    line = ('arch=trm data_paths="[data/sudoku-extreme-1k-aug-1000]" evaluators="[]" epochs=50000 '
            'eval_interval=5000 lr=1e-4 puzzle_emb_lr=1e-4 weight_decay=1.0 puzzle_emb_weight_decay=1.0 '
            'arch.mlp_t=True arch.pos_encodings=none arch.L_layers=2 arch.H_cycles=3 arch.L_cycles=6 '
            '+run_name=pretrain_mlp_t_sudoku ema=True')
    import shlex

    cfg = command_line.parse(shlex.split(line))
    arch = config.resolved_model(cfg.model)
    assert cfg.model.name == "trm-7m" and arch.family == "trm" and arch.mlp_t is True
    assert (arch.pos_encodings, arch.H_cycles, arch.L_cycles) == ("none", 3, 6)
    assert cfg.data_dir == "data/sudoku-extreme-1k-aug-1000" and cfg.training.ema is True
    assert cfg.run_name == "pretrain_mlp_t_sudoku"


@pytest.mark.parametrize("override, expected", [
    ("arch.hiden_size=64", "did you mean 'arch.hidden_size'"),
    ("arch.H_cycle=2", "did you mean 'arch.H_cycles'"),
    ("puzle_emb_lr=1e-4", "did you mean 'puzzle_emb_lr'"),
    ("model=mini arch.H_cycles=2", "arch.H_cycles (model.H_cycles) is not a key of model=mini (GPT): it belongs to "
                                   "HRM and TRM; model=hrm-tiny (or arch=hrm_v1) or model=trm-tiny (or arch=trm) "
                                   "selects one"),
    ("evaluators=[arc]", "evaluators=[arc]: only [] is supported"),
    ('data_paths=[a,b]', "give exactly one data directory"),
])
def test_guide_keys_give_clear_errors(override, expected):
    with pytest.raises(UserError, match=None) as e:
        command_line.parse(override.split())
    assert expected in str(e.value)


@pytest.mark.parametrize("override, expected", [
    # a choice's value is checked as the key's type, as it is read: the message names the key as typed
    ("arch.pos_encodings=alibi", "arch.pos_encodings='alibi': expected one of auto, rope, learned, sudoku, none"),
    ("arch.halt_max_steps=0", "model.halt_max_steps=0: must be greater than 0"),
    ("arch.loss_type=focal", "expected one of softmax, stablemax"),
])
def test_recurrent_keys_are_checked(override, expected):
    with pytest.raises(UserError) as e:
        command_line.parse(["model=hrm-tiny", override])
    assert expected in str(e.value)


def test_the_papers_commands_in_the_benchmark_parse():
    """bench/hrm_sudoku.py paper prints the commands that reproduce the papers' Sudoku-Extreme runs on a GPU
    machine: their trainer overrides must all be ours (a wrong key there would only show on that machine)."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "bench" / "hrm_sudoku.py").read_text()
    paper = re.search(r'PAPER = """(.*?)"""', text, re.S).group(1).replace("\\\\\n", " ")
    lines = [shlex.split(l) for l in paper.splitlines() if l.startswith("hrmctl train")]
    assert len(lines) == 2
    for argv in lines:
        overrides = [a for a in argv[2:] if "=" in a and not a.startswith("-")]
        cfg = command_line.parse(overrides)
        assert cfg.data_dir == "data/sudoku-extreme-1k-aug-1000" and cfg.training.epochs > 0
