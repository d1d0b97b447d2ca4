"""The checkpoint manager (auralm.training.checkpoint_manager) over real checkpoint files: a part registered before
the resume is loaded there, one registered after it (a strategy's, made as it attaches) is handed its state as it
registers; a shared part the checkpoint lacks is told so (``missing``); a per-rank part is kept as a list in rank
order and named in state.json; the guard's kind of part (``in_state``) lives in state.json, not in a file."""

from __future__ import annotations

import json

import pytest
import torch

from auralm.training import checkpoint, distributed
from auralm.training.checkpoint_manager import CheckpointManager

pytestmark = pytest.mark.usefixtures("one_thread")


class Counter:
    def __init__(self, n: int = 0):
        self.n = n

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


class Writer:
    """The single process's way of writing (auralm.parallel.single.Single.save), without a run around it."""
    sharded_checkpoints = False

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def save(self, run_dir, step, rng, state, extra):
        return checkpoint.save(run_dir, step, self.model, self.optimizer, rng, state, 3, extra)


class Log:
    def __init__(self):
        self.lines = []

    def say(self, line: str) -> None:
        self.lines.append(line)


def _manager(tmp_path, seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    return CheckpointManager(distributed.Dist(), Writer(model, optimizer), tmp_path, model, optimizer), model


def test_parts_saved_together_and_handed_back_before_and_after_the_resume(tmp_path):
    ckpt, model = _manager(tmp_path, 0)
    carry, outer, guard = Counter(3), Counter(5), Counter(7)
    ckpt.register("carry", carry, per_rank=True)
    ckpt.register("outer", get=lambda: {"m": outer.n}, put=lambda s: setattr(outer, "n", s["m"]))
    ckpt.register("guard", guard, in_state=True)
    path = ckpt.save(4, {"data_position": 9}, {"task": "sudoku"})
    state = json.loads((path / "state.json").read_text())
    assert state["per_rank_extras"] == ["carry"] and state["guard"] == {"n": 7} and state["data_position"] == 9
    assert checkpoint.read_extra(path, "carry") == [{"n": 3}]  # one entry per rank, in rank order
    assert not (path / "guard.pt").exists()
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    again, model2 = _manager(tmp_path, 1)  # other initial weights
    carry2, guard2, ema = Counter(), Counter(), Counter(1)
    missing = []
    again.register("carry", carry2, per_rank=True)
    again.register("guard", guard2, in_state=True)
    again.register("ema", ema, missing=lambda: missing.append("ema"))
    seen = []
    resumed = again.resume(checkpoint.candidates(tmp_path), Log(), lambda p, s: seen.append(p))
    assert resumed["step"] == 4 and seen == [path]
    assert (carry2.n, guard2.n) == (3, 7) and missing == ["ema"] and ema.n == 1
    assert all(torch.equal(saved[k], v) for k, v in model2.state_dict().items())
    outer2 = Counter()
    again.register("outer", get=lambda: {"m": outer2.n}, put=lambda s: setattr(outer2, "n", s["m"]))
    assert outer2.n == 5  # registered after the resume: handed its state as it registers
    with pytest.raises(ValueError, match="registered twice"):
        again.register("outer", outer2)


def test_a_fresh_run_hands_nothing_and_a_checkpoint_that_does_not_fit_is_refused(tmp_path):
    ckpt, _ = _manager(tmp_path, 0)
    part = Counter(2)
    ckpt.register("part", part, missing=lambda: pytest.fail("a fresh run has no checkpoint to miss a part"))
    log = Log()
    assert ckpt.resume([], log, lambda p, s: None) is None and part.n == 2
    assert log.lines == ["no checkpoint found: starting fresh"]
    ckpt.save(2, {}, {})
    from auralm.errors import UserError

    def refuse(p, s):
        raise UserError(f"checkpoint {p} is for another model")

    other, _ = _manager(tmp_path, 1)
    with pytest.raises(UserError, match="is for another model"):
        other.resume(checkpoint.candidates(tmp_path), Log(), refuse)
