"""A model family added from outside auralm (tests/toy_family.py: one ModelFamily, one register() call, named in
AURALM_MODEL_PLUGINS) is a model like the built-in ones: chosen with model=toy-tiny, checked by the config, sized
by the launcher's preflight, and trained by `hrmctl train` (torchrun, a process of its own) to a checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.trainer.helpers import by_step, python_env

PLUGIN = {"AURALM_MODEL_PLUGINS": "tests.toy_family"}


def _auralm(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, env=env)


def test_the_toy_family_is_registered_checked_and_sized():
    env = python_env(**PLUGIN)
    res = _auralm("auralm.planning.sizing", "--json", "model=toy-tiny", "training.batch_size=8", env=env)
    assert res.returncode == 0, res.stderr
    size = json.loads(res.stdout)
    d = 32  # the toy's n_embd: cell and position embeddings, one residual MLP, a head over 9 digits
    assert size["parameters"] == 10 * d + 81 * d + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d) + (d * 9 + 9)
    res = _auralm("auralm.training.command_line", "model=toy-tiny", "model.block_size=64", env=env)  # the family's own check
    assert res.returncode == 2 and res.stderr.strip() == ("error: model.block_size=64: toy-tiny sees the 81 cells "
                                                          "of a sudoku"), res.stderr
    res = _auralm("auralm.training.command_line", "model=toy-tiny", "task=lm", env=env)  # a family of one task
    assert res.returncode == 2 and "model=toy-tiny (Toy (an MLP per cell)) trains task=sudoku" in res.stderr
    res = _auralm("auralm.training.command_line", "model=toy-tiny", env=python_env())  # without the plugin: not a size
    assert res.returncode == 2 and "model='toy-tiny': expected one of tiny," in res.stderr, res.stderr
    res = _auralm("auralm.training.command_line", env=python_env(AURALM_MODEL_PLUGINS="tests.no_such_family"))
    assert res.returncode == 2 and res.stderr.startswith("error: AURALM_MODEL_PLUGINS: cannot import the model family "
                                                         "module 'tests.no_such_family'"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1  # one line, no traceback


def test_hrmctl_train_trains_the_toy_family(sudoku_data, tmp_path):
    res = subprocess.run([sys.executable, "-m", "cli", "train", "--run-id", "toy", f"data_dir={sudoku_data(1200)}",
                          "model=toy-tiny", "training.max_steps=30", "training.batch_size=32",
                          "training.log_interval=1", "training.eval_interval=0", "training.checkpoint_interval=0",
                          "training.warmup_steps=5", "training.lr=3e-3"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=python_env(**PLUGIN))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "model toy-tiny (toy):" in out
    run = tmp_path / "runs" / "toy"
    steps = by_step(run)
    assert sorted(steps) == list(range(1, 31))
    first = sum(steps[s]["loss"] for s in range(1, 6)) / 5
    last = sum(steps[s]["loss"] for s in range(26, 31)) / 5
    # it learns: a cell on its own sees only its own value, so what it can learn is which digits are likely there
    # (the loss goes from about 2.44 at initialisation towards ln 9 = 2.20; measured 2.44 -> 2.25 over 30 steps)
    assert last < first - 0.1, (first, last)
    [ckpt] = sorted(run.glob("checkpoint-*"))
    assert ckpt.name == "checkpoint-30" and (ckpt / "state.json").exists()
    saved = json.loads((run / "config.json").read_text())
    assert saved["model"]["family"] == "toy" and saved["task"] == "sudoku"
    load = ("import sys; from auralm.models.pretrained import load; m, f = load(sys.argv[1]); "
            "print(type(m).__name__, f.arch.family)")  # in a process of its own, the plugin named
    res = subprocess.run([sys.executable, "-c", load, str(ckpt)], capture_output=True, text=True, timeout=120,
                         env=python_env(**PLUGIN))
    assert res.returncode == 0 and res.stdout.split() == ["ToyMLP", "toy"], res.stderr
