"""The tasks' registry (auralm.tasks): a task registered from outside the package (tests/toy_task.py) is what
``task=`` accepts and what `hrmctl train` trains, reads and scores as it declares; without it the name is refused in
one line; the built-in tasks answer what the trainer, the planners and the tools ask of them (no caller tests a
task's name)."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys

import pytest
import torch

from auralm import tasks
from auralm.training import config
from tests.trainer.helpers import by_step, python_env

PLUGIN = {"AURALM_MODEL_PLUGINS": "tests.toy_task"}


def _grids_data(sudoku_dir, tmp_path):
    data = tmp_path / "grids"
    shutil.copytree(sudoku_dir, data)
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps(dict(meta, task="grids")))  # its own data: a manifest of task=grids
    return data


@pytest.fixture
def toy_task():
    """tests/toy_task.py registered in this process for one test only: the registries are as they were afterwards,
    so that a later test of the same process that lists every family or task (test_guide_spellings') sees the
    built-in ones alone."""
    from auralm.models import registry

    tables = (registry._FAMILIES, registry.SIZES, registry._SIZE_TASKS, tasks._REGISTRY)
    saved = [{k: set(v) if isinstance(v, set) else v for k, v in t.items()} for t in tables]
    sys.modules.pop("tests.toy_task", None)
    yield importlib.import_module("tests.toy_task")  # imported anew: its registrations run
    sys.modules.pop("tests.toy_task", None)
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)


def test_hrmctl_train_trains_a_task_registered_outside_the_package(sudoku_data, tmp_path):
    data = _grids_data(sudoku_data(1200), tmp_path)
    res = subprocess.run([sys.executable, "-m", "cli", "train", "--run-id", "grids", f"data_dir={data}", "task=grids",
                          "model=toy-grids-tiny", "training.max_steps=3", "training.batch_size=32",
                          "training.log_interval=1", "training.eval_interval=0", "training.checkpoint_interval=0",
                          "training.augment=true"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=python_env(**PLUGIN))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    run = tmp_path / "runs" / "grids"
    assert sorted(by_step(run)) == [1, 2, 3]
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    final = [e for e in evals if "exact_accuracy" in e]  # the final evaluation: whole grids, under its own key
    assert final and "grid_cell_acc" in final[-1] and "cell_acc" not in final[-1], final
    saved = json.loads((run / "config.json").read_text())
    assert saved["task"] == "grids" and saved["model"]["family"] == "toy-grids"
    # without the plugin the name is refused before anything runs, in one line
    res = subprocess.run([sys.executable, "-m", "auralm.training.command_line", "task=grids"], capture_output=True,
                         text=True, timeout=120, env=python_env())
    assert res.returncode == 2 and res.stderr.strip() == "error: task='grids': expected one of sudoku, lm, maze", res.stderr


def test_a_task_reads_its_splits_and_scores_by_what_it_declares(sudoku_data, tmp_path, monkeypatch, toy_task):
    from auralm.data import datadir
    from auralm.tools.evaluate import evaluate

    toy_task.Grids.opened = []
    data = _grids_data(sudoku_data(1200), tmp_path)
    val = tasks.open_split(data, datadir.load_manifest(data, "grids"), "val", 81)
    assert toy_task.Grids.opened == ["val"]
    model = toy_task.toy_family.build("grids", toy_task.toy_family.SIZES["toy-tiny"], None)
    ev = evaluate(model, val, "grids", 16, 2, torch.device("cpu"), torch.autocast("cpu", enabled=False))
    assert set(ev) == {"val_loss", "grid_cell_acc", "exact_accuracy", "ci95"}
    assert set(ev["ci95"]) == {"grid_cell_acc", "exact_accuracy"}  # each accuracy's interval, by the task's names
    ev = evaluate(model, val, "sudoku", 16, 2, torch.device("cpu"), torch.autocast("cpu", enabled=False))
    assert set(ev) == {"val_loss", "cell_acc", "exact_accuracy", "ci95"}


def test_the_built_in_tasks_declare_what_the_trainer_and_the_planners_ask():
    sudoku, text = tasks.get("sudoku"), tasks.get("lm")
    arch = config.SIZES["trm-tiny"].replace(n_embd=64, block_size=128, puzzle_emb_ndim=64)
    assert (sudoku.positions(arch), sudoku.classes(None), sudoku.solved_whole, sudoku.augment) == (82, 9, True, True)
    assert sudoku.positions(arch.replace(puzzle_emb_len=16)) == 97  # TRM's: the embedding, then 15 of zeros
    assert (text.positions(arch), text.classes(4096), text.solved_whole, text.tokenized) == (128, 4096, False, True)
    assert text.vocab({"tokenizer": {"vocab_size": 4096}}) == 4096 and sudoku.vocab({}) is None
    x, y = sudoku.random_batch(arch, None, 4, torch.device("cpu"))
    assert x.shape == y.shape == (4, 81) and bool(((y == -100) == (x != 0)).all())  # a target on every blank
    full = sudoku.targets(x, y)
    assert bool((full[x != 0] == x[x != 0] - 1).all()) and bool((full[x == 0] == y[x == 0]).all())
    assert text.default_rows() is None and sudoku.default_rows()[0] > 0
