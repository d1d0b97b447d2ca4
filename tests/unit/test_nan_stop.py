"""The NaN guard's stop: a window of steps all skipped (or every step of a shorter run) ends the run with one line
naming the likely cause and the override; a run that learned something is left alone.

The guard here is the real one, on a real (tiny) model and optimizer in one process; the steps' losses and gradient
norms are handed to it as the trainer hands them (``check`` then ``after_step``)."""

from __future__ import annotations

import pytest
import torch

from auralm.training import config
from auralm.training.distributed import Dist
from auralm.training.nan_guard import STOP_AFTER, NanGuard, NanStop
from auralm.training.runlog import RunLog

NAN, ONE = torch.tensor(float("nan")), torch.tensor(1.0)


def guard(*overrides: str, precision: str = "fp32", begin: int = 0) -> NanGuard:
    cfg = config.parse(["training.max_steps=100", *overrides])
    model = torch.nn.Linear(3, 2)
    g = NanGuard(cfg.guard, Dist(), model, torch.optim.AdamW(model.parameters()), RunLog(None), run=cfg,
                 precision=precision)
    g.begin(begin)
    return g


def steps(g: NanGuard, losses: list[torch.Tensor], norms: list[torch.Tensor], start: int = 1,
          scaler_skipped: bool = False) -> int:
    """Hand the guard these steps; the last step handed."""
    at = start - 1
    for at, (loss, norm) in enumerate(zip(losses, norms), start):
        ok, _ = g.check(at, loss, norm)
        g.after_step(at, ok, scaler_skipped=scaler_skipped)
    return at


def stop(g: NanGuard, losses, norms, start: int = 1) -> str:
    with pytest.raises(NanStop) as e:
        steps(g, losses, norms, start)
    return str(e.value)


def test_twenty_bad_steps_in_a_row_stop_in_bf16_with_training_dtype_fp32():
    g = guard(precision="bf16")
    line = stop(g, [ONE] * 100, [NAN] * 100)
    assert line.startswith(f"nan guard: stopping: all {STOP_AFTER} steps 1-{STOP_AFTER} skipped on every rank "
                           f"(non-finite gradients on rank 0), and no update was applied in this run: ")
    assert "in bf16 arithmetic (training.dtype=auto chose bf16 on this device)" in line
    assert line.endswith("; rerun with training.dtype=fp32") and "\n" not in line


def test_nineteen_bad_steps_then_a_good_one_go_on():
    g = guard()
    assert steps(g, [ONE] * 19 + [ONE], [NAN] * 19 + [ONE]) == 20
    assert steps(g, [ONE] * 19, [NAN] * 19, start=21) == 39  # the count starts again after an applied update


def test_after_good_steps_the_cause_is_divergence_and_the_fix_a_lower_lr():
    g = guard("training.lr=3e-3", precision="bf16")
    steps(g, [ONE] * 7, [ONE] * 7)
    line = stop(g, [NAN] * 30, [NAN] * 30, start=8)
    assert "all 20 steps 8-27 skipped" in line and "non-finite gradients and loss" in line
    assert "no update was applied" not in line
    assert "training diverged after step 7 at training.lr=0.003" in line
    assert line.endswith("rerun with training.lr=0.0003")


def test_fp32_from_the_first_step_with_stablemax_points_at_the_loss():
    line = stop(guard("model=hrm-tiny", "model.loss_type=stablemax"), [NAN] * 20, [NAN] * 20)
    assert "from its initial weights in fp32, before any update" in line
    assert line.endswith("rerun with model.loss_type=softmax")


def test_fault_injection_is_named_as_the_cause():
    line = stop(guard("fault.nan_at_step=1-40", precision="bf16"), [ONE] * 20, [NAN] * 20)
    assert "fault.nan_at_step puts NaN into rank 0's gradients" in line
    assert line.endswith("rerun without fault.nan_at_step")


def test_a_run_shorter_than_the_window_with_every_step_skipped_stops_at_its_last_step():
    g = guard("training.max_steps=6", precision="bf16")
    line = stop(g, [ONE] * 6, [NAN] * 6)
    assert "all 6 steps 1-6 skipped" in line and line.endswith("rerun with training.dtype=fp32")


def test_a_short_run_with_one_applied_step_finishes():
    g = guard("training.max_steps=6")
    assert steps(g, [ONE] * 6, [ONE] + [NAN] * 5) == 6


def test_a_resumed_run_counts_its_own_steps_and_names_the_checkpoint():
    g = guard("training.max_steps=44", begin=40)
    line = stop(g, [NAN] * 4, [NAN] * 4, start=41)
    assert "all 4 steps 41-44 skipped" in line and "from the checkpoint of step 40 in fp32" in line
    assert "rerun from an earlier checkpoint of this run" in line


def test_fp16_whose_scaler_skipped_every_update_is_not_a_quiet_success():
    g = guard("training.max_steps=3", "training.dtype=fp16", precision="fp16")
    with pytest.raises(NanStop, match=r"^training.dtype=fp16: its GradScaler skipped the update of every one of the 3 "
                                      r"steps .* rerun with training.dtype=bf16 \(or fp32\)$"):
        steps(g, [ONE] * 3, [ONE] * 3, scaler_skipped=True)


def test_diloco_rounds_count_their_steps():
    g = guard("training.max_steps=100")
    for end in (5, 10, 15):
        g.after_round(end, [5], [], learned=False)
        g.after_step(end, False)
    with pytest.raises(NanStop, match="all 20 steps 1-20 skipped"):
        g.after_round(20, [5], [], learned=False)
        g.after_step(20, False)
    g = guard()
    g.after_round(5, [3], [], learned=True)  # some local steps applied: the round learned
    g.after_step(5, False)
    assert g.last_applied == 5 and g.updates == 1
