"""The trainer in one process: it learns, logs, checkpoints, and resumes exactly."""

from __future__ import annotations

import math
import os
import re
import shutil

import pytest
import torch

from auralm.data import datadir
from auralm.training import command_line, config, train
from auralm.errors import UserError
from tests.trainer.helpers import by_step, records, small_sudoku, tiny_args


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(1200)


def _run(*args):
    return train.run(command_line.parse(list(args)))


@pytest.mark.slow
def test_sudoku_loss_and_accuracy_improve(sudoku_dir, tmp_path, capsys):
    _run(*tiny_args(sudoku_dir, tmp_path, "training.max_steps=80", "training.batch_size=32", "training.lr=1e-2",
                    "training.log_interval=20", "training.eval_interval=80"))
    out = capsys.readouterr().out
    lines = [l for l in out.splitlines() if l.startswith("step ")]
    assert [int(re.match(r"^step (\d+)/(\d+) ", l).group(1)) for l in lines] == [20, 40, 60, 80]
    assert all(re.match(r"^step \d+/80 \| loss \d+\.\d{4} \| lr \S+ \| \d+ puzzles/s \| rss \S+G \| eta \S+$", l) for l in lines)
    last = by_step(tmp_path)[80]
    assert set(last) >= {"step", "loss", "lr", "samples_per_s", "val_loss", "cell_acc", "exact_accuracy", "rss_gb"}
    assert last["val_loss"] < math.log(9) - 0.25  # well below the uniform guess over 9 digits (2.197)
    assert last["cell_acc"] > 0.28  # a random digit is right 1 time in 9
    assert (tmp_path / "config.json").exists() and (tmp_path / "checkpoint-80").exists()


@pytest.mark.slow
def test_lm_loss_decreases_on_the_spanish_text(tmp_path, capsys, quijote_data):
    lm = quijote_data(512, 40000)
    _run("task=lm", f"data_dir={lm}", f"out_dir={tmp_path / 'run'}", "model=tiny", "training.batch_size=16",
         "logging.curves=false",
         "training.max_steps=40", "training.lr=1e-2", "training.warmup_steps=5", "training.log_interval=1",
         "training.eval_interval=40", "training.sample_prompt=En un lugar de la Mancha", "training.sample_tokens=8")
    m = by_step(tmp_path / "run")
    assert m[40]["val_loss"] < math.log(512) - 0.5
    assert sum(m[s]["loss"] for s in range(36, 41)) / 5 < m[1]["loss"] - 0.5
    assert "tokens_per_s" in m[1]
    assert 'sample: "En un lugar de la Mancha' in capsys.readouterr().out


@pytest.mark.slow
def test_resume_continues_exactly_like_an_uninterrupted_run(sudoku_dir, tmp_path, capsys):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _run(*tiny_args(sudoku_dir, whole, "training.max_steps=16", "training.checkpoint_interval=8",
                    "training.keep_last=5", "model.dropout=0.1"))
    _run(*tiny_args(sudoku_dir, resumed, "training.max_steps=16", "model.dropout=0.1",
                    f"resume={whole / 'checkpoint-8'}"))
    assert f"resuming from {whole / 'checkpoint-8'} (step 8)" in capsys.readouterr().out
    a, b = by_step(whole), by_step(resumed)
    assert sorted(b) == list(range(9, 17))
    for step in range(9, 17):
        assert abs(a[step]["loss"] - b[step]["loss"]) < 1e-5, step


@pytest.mark.slow
def test_lm_resume_with_dropout_continues_exactly(tmp_path, capsys, quijote_data):
    """auralm's own GPT (dropout in attention and residuals, the chunked loss) resumes bit for bit."""
    lm = quijote_data(300, 20000)
    common = ["task=lm", f"data_dir={lm}", "model=tiny", "model.dropout=0.1", "training.batch_size=8",
              "logging.curves=false", "training.max_steps=12", "training.log_interval=1", "training.eval_interval=0",
              "training.sample_tokens=0"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    _run(*common, f"out_dir={whole}", "training.checkpoint_interval=6")
    _run(*common, f"out_dir={resumed}", f"resume={whole / 'checkpoint-6'}")
    assert f"resuming from {whole / 'checkpoint-6'} (step 6)" in capsys.readouterr().out
    a, b = by_step(whole), by_step(resumed)
    assert sorted(b) == list(range(7, 13))
    for step in range(7, 13):
        assert abs(a[step]["loss"] - b[step]["loss"]) < 1e-5, step


@pytest.mark.slow
def test_a_truncated_checkpoint_falls_back_to_the_previous_one(sudoku_dir, tmp_path, capsys):
    _run(*tiny_args(sudoku_dir, tmp_path, "training.max_steps=8", "training.checkpoint_interval=4"))
    weights = tmp_path / "checkpoint-8" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    capsys.readouterr()
    _run(*tiny_args(sudoku_dir, tmp_path, "training.max_steps=8", "training.checkpoint_interval=4", "resume=latest"))
    out = capsys.readouterr().out
    assert f"checkpoint {tmp_path / 'checkpoint-8'} is unusable (model.safetensors does not match its checksum" in out
    assert f"resuming from {tmp_path / 'checkpoint-4'} (step 4)" in out
    assert [r["step"] for r in records(tmp_path)] == list(range(1, 9)) + list(range(5, 9))


def test_resume_latest_without_a_checkpoint_starts_fresh(sudoku_dir, tmp_path, capsys):
    _run(*tiny_args(sudoku_dir, tmp_path, "training.max_steps=2", "resume=latest"))
    assert "no checkpoint found: starting fresh" in capsys.readouterr().out
    assert [r["step"] for r in records(tmp_path)] == [1, 2]


def test_a_checkpoint_of_another_model_is_refused_and_nothing_is_overwritten(sudoku_dir, tmp_path):
    _run(*tiny_args(sudoku_dir, tmp_path, "training.max_steps=2"))
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=r"checkpoint .*checkpoint-2 is for task=sudoku model .*'n_layer': 2.*"
                                        r"not this run's model .*'n_layer': 3"):
        _run(*tiny_args(sudoku_dir, tmp_path, "training.max_steps=4", "model.n_layer=3", "resume=latest"))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_missing_data_and_too_little_data_are_clear_errors(sudoku_dir, tmp_path):
    with pytest.raises(UserError, match="no data in .*nowhere .*hrmctl prepare-data"):
        _run(*tiny_args(tmp_path / "nowhere", tmp_path / "run"))
    few = small_sudoku(tmp_path / "few", 20)
    with pytest.raises(UserError, match="fewer than one batch"):
        _run(*tiny_args(few, tmp_path / "run", "training.batch_size=64"))
    shutil.copytree(sudoku_dir, tmp_path / "copy")
    with pytest.raises(UserError, match="holds 'sudoku' data but task=lm"):
        _run(*tiny_args(tmp_path / "copy", tmp_path / "run", "task=lm"))


@pytest.mark.slow
def test_gradient_accumulation_and_checkpointing_give_the_same_training(tmp_path, quijote_data):
    lm = quijote_data(300, 20000)
    common = ["task=lm", f"data_dir={lm}", "model=tiny", "training.max_steps=4", "training.log_interval=1",
              "training.eval_interval=0", "training.sample_tokens=0"]
    _run(*common, f"out_dir={tmp_path / 'plain'}", "training.batch_size=8")
    _run(*common, f"out_dir={tmp_path / 'accum'}", "training.batch_size=4", "training.grad_accum=2")
    model = _run(*common, f"out_dir={tmp_path / 'ckpt'}", "training.batch_size=8", "training.grad_checkpoint=true")
    assert model.grad_checkpointing
    plain, accum, ckpt = (by_step(tmp_path / n) for n in ("plain", "accum", "ckpt"))
    for step in range(1, 5):  # the same 8 windows per step: as one batch, or as two micro-batches of 4
        assert abs(plain[step]["loss"] - accum[step]["loss"]) < 1e-4, step
        assert abs(plain[step]["loss"] - ckpt[step]["loss"]) < 1e-5, step


def test_memory_figure_is_the_current_rss_and_says_so(sudoku_dir, tmp_path, capsys):
    import psutil

    kind, gb = train.memory_gb(torch.device("cpu"))
    assert kind == "rss" and abs(gb - psutil.Process().memory_info().rss / 1e9) < 0.2
    _run(*tiny_args(sudoku_dir, tmp_path, "training.max_steps=1"))
    assert re.search(r"^step 1/1 \| .* \| rss \d+\.\dG \| eta \S+$", capsys.readouterr().out, re.M)
    [rec] = records(tmp_path)
    assert 0 < rec["rss_gb"] < 100 and "mem_gb" not in rec


def test_unwritable_out_dir_or_data_dir_is_one_line_and_exit_2(sudoku_dir, tmp_path, capsys, monkeypatch):
    """These tests run as root, who may write anywhere: a directory is made unwritable by a file in its
    path (no directory can be made there), or by os.access saying no, as it does to another user."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert train.main(tiny_args(sudoku_dir, blocker / "run", "training.max_steps=1")) == 2
    err = capsys.readouterr().err
    assert err == f"error: cannot write the run directory {blocker / 'run'}: {blocker} is not a directory; " \
                  "give out_dir= a directory you can write, or fix its permissions\n"

    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if str(p).startswith(str(locked)) else real(p, mode))
    assert train.main(tiny_args(sudoku_dir, locked / "run", "training.max_steps=1")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write the run directory {locked / 'run'}: {locked} is not writable by ")
    assert len(err.splitlines()) == 1 and "Traceback" not in err

    # the default sudoku data, to be generated where the node's user cannot write
    monkeypatch.setenv(train.DEFAULT_DATA_ENV, str(locked / "data" / "sudoku"))
    args = tiny_args(locked / "data" / "sudoku", tmp_path / "run", "training.max_steps=1")
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot generate the default sudoku data in {locked / 'data' / 'sudoku'}: "
                          f"{locked} is not writable by ") and len(err.splitlines()) == 1, err

    # a read error on the data (an unreadable meta.json) is one line too
    def unreadable(data_dir, task):
        raise PermissionError(13, "Permission denied", str(data_dir / "meta.json"))

    monkeypatch.setattr(datadir, "load_manifest", unreadable)
    assert train.main(tiny_args(sudoku_dir, tmp_path / "run2", "training.max_steps=1")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot use the data in {sudoku_dir}: Permission denied ({sudoku_dir / 'meta.json'})")
    assert len(err.splitlines()) == 1


def test_the_nodes_default_data_dir_gets_the_default_sudoku_data_a_given_one_does_not(sudoku_dir, tmp_path,
                                                                                        monkeypatch):
    """hrmctl passes the inventory's data_dir as data_dir= and names it in HRMCTL_DEFAULT_DATA_DIR: the trainer
    generates the embedded default there when it is missing, as it does in data/sudoku; a data_dir the user
    gave is never filled behind their back."""
    made = []

    def ensure(path):
        made.append(path)
        shutil.copytree(sudoku_dir, path)

    monkeypatch.setattr(datadir, "ensure_sudoku", ensure)
    node_dir = tmp_path / "node-data" / "sudoku"
    monkeypatch.setenv(train.DEFAULT_DATA_ENV, str(node_dir))
    _run(*tiny_args(node_dir, tmp_path / "run", "training.max_steps=1"))
    assert made == [node_dir] and (node_dir / "meta.json").is_file()
    _run(*tiny_args(node_dir, tmp_path / "run2", "training.max_steps=1"))  # there now: read, not made again
    assert made == [node_dir]
    with pytest.raises(UserError, match="no data in .*elsewhere.*hrmctl prepare-data --task sudoku"):
        _run(*tiny_args(tmp_path / "elsewhere" / "sudoku", tmp_path / "run3", "training.max_steps=1"))
    monkeypatch.setenv(train.DEFAULT_DATA_ENV, "~/data/sudoku")  # `~` is this user's home, as on a node
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    _run("data_dir=~/data/sudoku", *tiny_args(sudoku_dir, tmp_path / "run4", "training.max_steps=1")[1:])
    assert made[-1] == tmp_path / "home" / "data" / "sudoku"


@pytest.mark.slow
def test_a_causal_hrm_learns_text_and_logs_its_recurrent_metrics(tmp_path, capsys, quijote_data):
    """task=lm with HRM (the 50m/100m use case, shrunk): the loss falls; every log line has H-updates and L-steps
    per token, ponder and the Q losses; arch.halt_max_steps=1 turns ACT off (one segment, no Q-continue target)."""
    lm = quijote_data(512, 40000)
    common = ["task=lm", f"data_dir={lm}", "model=hrm-tiny", "arch.hidden_size=64", "arch.num_heads=2",
              "arch.seq_len=64", "training.batch_size=8", "training.lr=3e-3", "training.warmup_steps=5",
              "training.log_interval=1", "training.checkpoint_interval=0"]
    _run(*common, f"out_dir={tmp_path / 'act'}", "arch.halt_max_steps=3", "training.max_steps=30",
         "training.eval_interval=30", "training.eval_batches=2")
    m = by_step(tmp_path / "act")
    assert sum(m[s]["loss"] for s in range(26, 31)) / 5 < m[1]["loss"] - 0.5
    halted = [m[s] for s in m if m[s]["ponder"] > 0]
    assert halted and all(1 <= r["ponder"] <= 3 for r in halted)
    cfg = config.resolved_model(command_line.parse(common).model)
    for r in halted:  # per token and example: ponder x H_cycles H-updates, x L_cycles more L-steps
        assert r["h_updates"] == pytest.approx(r["ponder"] * cfg.H_cycles)
        assert r["l_steps"] == pytest.approx(r["h_updates"] * cfg.L_cycles)
    assert {"lm_loss", "q_halt_loss", "q_continue_loss", "val_loss"} <= set(m[30])
    assert m[30]["val_loss"] < math.log(512)

    _run(*common, f"out_dir={tmp_path / 'noact'}", "arch.halt_max_steps=1", "training.max_steps=4",
         "training.eval_interval=0", "training.eval_batches=1")
    m = by_step(tmp_path / "noact")
    assert all(m[s]["ponder"] == 1 and m[s]["q_continue_loss"] == 0 for s in range(1, 5))


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_the_papers_adam_atan2_optimizer_trains_and_resumes(sudoku_dir, tmp_path, capsys):
    """training.optimizer=adam_atan2 (the package adam-atan2-pytorch, the papers' AdamATan2): the model trains with
    it, and a resumed run restores its state exactly like an uninterrupted one."""
    common = [f"data_dir={sudoku_dir}", "model=trm-tiny", "arch.hidden_size=32", "arch.num_heads=2",
              "training.optimizer=adam_atan2", "training.batch_size=16", "training.log_interval=1",
              "training.eval_interval=0", "training.eval_batches=1", "training.checkpoint_interval=2",
              "training.dtype=fp32"]
    _run(*common, f"out_dir={tmp_path / 'whole'}", "training.max_steps=4")
    _run(*common, f"out_dir={tmp_path / 'cut'}", "training.max_steps=2")
    _run(*common, f"out_dir={tmp_path / 'cut'}", "training.max_steps=4", "resume=latest")
    whole, cut = by_step(tmp_path / "whole"), by_step(tmp_path / "cut")
    assert all(math.isfinite(whole[s]["loss"]) for s in range(1, 5))
    assert [cut[s]["loss"] for s in (3, 4)] == [whole[s]["loss"] for s in (3, 4)]
    from auralm import models
    from auralm.training import optim

    cfg = command_line.parse(common)
    model = models.build("sudoku", config.resolved_model(cfg.model))
    assert type(optim.make_optimizer(model, cfg.training, torch.device("cpu"))).__name__ == "AdamAtan2"
