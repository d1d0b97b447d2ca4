"""A sync mode added from outside auralm (tests/toy_sync.py: one class, one ``strategy.register`` call, named in
AURALM_MODEL_PLUGINS) is a mode like the built-in ones: accepted by the config's check of ``training.sync``, and
trained by `hrmctl train` on two ranks under torchrun, every step of the loop's going through it and its own part in
every checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys

from auralm.training import checkpoint
from tests.trainer.helpers import by_step, python_env

PLUGIN = {"AURALM_MODEL_PLUGINS": "tests.toy_sync"}


def test_hrmctl_train_trains_a_sync_mode_added_from_outside(sudoku_data, tmp_path):
    res = subprocess.run([sys.executable, "-m", "cli", "train", "--run-id", "counting", "--nproc", "2",
                          f"data_dir={sudoku_data(1200)}", "model=tiny", "training.sync=counting",
                          "training.max_steps=6", "training.batch_size=8", "training.log_interval=1",
                          "training.eval_interval=0", "training.checkpoint_interval=3", "logging.curves=false"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, env=python_env(**PLUGIN))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert "sync: counting, DDP's steps counted (rank 0 of 2)" in out, out[-3000:]
    run = tmp_path / "runs" / "counting"
    assert sorted(by_step(run)) == list(range(1, 7))
    assert json.loads((run / "config.json").read_text())["training"]["sync"] == "counting"
    for step in (3, 6):  # every step went through it: its own part of each checkpoint (rank 0's) counts them
        assert checkpoint.read_extra(run / f"checkpoint-{step}", "counting") == {"advanced": step}
    res = subprocess.run([sys.executable, "-m", "auralm.training.command_line", "training.sync=counting"],
                         capture_output=True, text=True, timeout=120, env=python_env())  # without the plugin
    assert res.returncode == 2 and "training.sync='counting': expected one of ddp, diloco" in res.stderr, res.stderr
