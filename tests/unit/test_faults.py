"""auralm/training/faults.py: the fault.* keys as hooks around the step; a run without them has none."""

from __future__ import annotations

import torch

from auralm.training import config, faults


def _fault(*overrides):
    return config.parse(list(overrides)).fault


def test_a_run_without_fault_keys_has_no_hook():
    assert faults.hooks(_fault(), rank=0, resumed=False) == []
    assert faults.hooks(_fault("training.max_steps=5"), rank=1, resumed=True) == []


def test_nan_goes_into_the_named_ranks_gradients_at_the_named_steps_only(capsys):
    params = [torch.nn.Parameter(torch.ones(3))]
    params[0].grad = torch.zeros(3)
    fault = _fault("fault.nan_at_step=2-3", "fault.nan_rank=1")
    [other] = faults.hooks(fault, rank=0, resumed=False)
    [named] = faults.hooks(fault, rank=1, resumed=False)
    assert not other.after_backward(2, params) and not named.after_backward(1, params)
    assert bool(torch.isfinite(params[0].grad).all())
    assert named.after_backward(3, params) and bool(torch.isnan(params[0].grad).all())
    assert "fault: NaN in rank 1's gradients at step 3" in capsys.readouterr().err


def test_the_kill_fires_once_not_in_a_resumed_run_and_the_sleep_every_step(monkeypatch):
    killed, slept = [], []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: killed.append(sig))
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    fault = _fault("fault.kill_at_step=4", "fault.kill_rank=1", "fault.step_sleep=0.25")
    [h] = faults.hooks(fault, rank=1, resumed=False)
    h.before_step(3)
    h.before_step(4)
    [resumed] = faults.hooks(fault, rank=1, resumed=True)
    resumed.before_step(4)
    assert killed == [faults.signal.SIGKILL] and slept == [0.25, 0.25, 0.25]
