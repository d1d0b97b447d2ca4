"""The HRM guide's own training line, pasted as it stands (only its data directory, the run's length and the record
of every step added), trains with finite loss under the default dtype (bf16 where the CPU has it).

Before stablemax's gradient was made finite at a logit of exactly 1.0, every step of this line had a non-finite
gradient under bf16: the NaN guard skipped all of them and the run still ended "finished"."""

from __future__ import annotations

import math
import shlex

import pytest
import torch

from auralm.training import command_line, train
from tests.trainer.helpers import by_step, records, small_sudoku

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

GUIDE_LINE = ("arch=hrm_v1 data_path=data/sudoku-extreme-small global_batch_size=4 lr=1e-4 arch.hidden_size=32 "
              "arch.H_layers=1 arch.L_layers=1 arch.num_heads=1 arch.expansion=2")


def test_the_hrm_guides_line_trains_with_finite_loss_under_the_default_dtype(tmp_path):
    data = small_sudoku(tmp_path / "sudoku-extreme-small", count=100)
    args = [a.replace("data/sudoku-extreme-small", str(data)) for a in shlex.split(GUIDE_LINE)]
    cfg = command_line.parse([*args, f"out_dir={tmp_path / 'run'}", "training.max_steps=6", "training.log_interval=1",
                        "training.eval_interval=0", "training.checkpoint_interval=0"])
    assert cfg.training.dtype == "auto" and cfg.model.name == "hrm-27m"  # the guide's line leaves both default
    if not train.bf16_compute(cfg.training, torch.device("cpu")):  # auto is fp32 on this CPU; a GPU's auto is bf16
        cfg.training.dtype = "bf16"
    train.run(cfg)
    steps = by_step(tmp_path / "run")
    assert sorted(steps) == list(range(1, 7))
    assert all(steps[s]["loss"] is not None and math.isfinite(steps[s]["loss"]) for s in steps), steps
    assert all(math.isfinite(steps[s]["grad_norm"]) and steps[s]["grad_norm"] > 0 for s in steps)
    assert not [e for e in records(tmp_path / "run", "events.jsonl") if e["kind"] in ("nan_skip", "recovery")]
