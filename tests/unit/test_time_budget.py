"""Every run states its time before the first step (and in --dry-run); a run over an hour says so with the override
that shortens it; the step lines carry an ETA; training.time_budget sizes a fresh run of no given length, and an
explicit length (the user's or a guide's) wins. The probe's figures are injected where a verdict would otherwise
depend on this machine's speed: what is asserted is what the plan makes of them."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import torch

from auralm.errors import UserError
from auralm.training import budget, command_line, config, train
from tests.trainer.helpers import by_step, python_env, records, tiny_args

pytestmark = pytest.mark.usefixtures("one_thread")


def _timing(step_s: float = 1.5, eval_batch_s: float = 2.0, gone_s: float = 10.0) -> budget.Timing:
    return budget.Timing(step_s=step_s, eval_batch_s=eval_batch_s, each_batches=8, final_batches=16, gone_s=gone_s)


# ---------------------------------------------------------------- training.time_budget's forms


@pytest.mark.parametrize("text, seconds", [("600", 600), ("10m", 600), ("1h", 3600), ("90s", 90), ("1.5h", 5400),
                                           ("2min", 120), ("0", None), ("none", None), ("0s", None)])
def test_the_budgets_forms(text, seconds):
    assert config.parse_budget(text) == seconds
    assert command_line.parse([f"training.time_budget={text}"]).training.time_budget == text


def test_a_bad_budget_is_one_line_naming_the_key_and_its_forms():
    with pytest.raises(UserError, match=r"^training.time_budget='abc': expected seconds \(600\) or a duration like "
                                        r"90s, 10m, 1.5h; 0 or none: no budget$"):
        command_line.parse(["training.time_budget=abc"])
    res = subprocess.run([sys.executable, "-m", "auralm.training.command_line", "training.time_budget=10 minutes"],
                         capture_output=True, text=True, env=python_env(), timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: training.time_budget='10 minutes': expected")


# ---------------------------------------------------------------- what the plan makes of the probe's figures


def test_the_budget_lowers_max_steps_to_what_fits_and_says_so_in_one_line():
    cfg = command_line.parse([])
    timing = _timing()
    said = dict(budget.plan(cfg, timing, 0, fresh=True))
    t = cfg.training
    n, room = t.max_steps, budget.MARGIN * 600 - timing.gone_s
    assert n < 1000 and timing.total_s(t, 0, n) <= room < timing.total_s(t, 0, n + 1)
    assert t.warmup_steps == 30  # a tenth of the new length still holds it
    assert said["time_budget"] == (
        f"training.max_steps={n} (was 1000) so that training and the final evaluation end within "
        f"training.time_budget=10m: 1.5 s/step measured, final evaluation ~32 s, 10 s since the start; set "
        f"training.max_steps=1000 for the full schedule (about {budget.duration(timing.total_s(t, 0, 1000))})")
    assert said["time"].startswith(f"time: {n} steps at 1.5 s/step = ")
    assert "time_long" not in said


def test_a_short_budget_shortens_the_warmup_with_the_run_and_says_it():
    cfg = command_line.parse(["training.time_budget=90s"])
    said = dict(budget.plan(cfg, _timing(), 0, fresh=True))
    t = cfg.training
    assert t.max_steps < 300 and t.warmup_steps == max(1, t.max_steps // 10) < 30
    assert f"training.warmup_steps={t.warmup_steps} (was 30)" in said["time_budget"]


@pytest.mark.parametrize("given", [["training.max_steps=1000"], ["training.max_steps=200"], ["training.epochs=2"],
                                   ["epochs=2"], ["training.time_budget=0"], ["training.time_budget=none"]])
def test_a_given_length_or_no_budget_is_never_changed(given):
    cfg = command_line.parse(given)
    before = (cfg.training.max_steps, cfg.training.warmup_steps)
    said = dict(budget.plan(cfg, _timing(), 0, fresh=True))
    assert (cfg.training.max_steps, cfg.training.warmup_steps) == before
    assert "time_budget" not in said and said["time"].startswith(f"time: {before[0]} steps at 1.5 s/step")


def test_a_length_from_a_config_file_is_given_too(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("training:\n  max_steps: 700\n")
    cfg = command_line.parse([f"config={path}"])
    budget.plan(cfg, _timing(), 0, fresh=True)
    assert cfg.training.max_steps == 700


def test_a_resumed_run_keeps_its_checkpoints_length_unless_one_is_given():
    state = {"config": {"training": {"max_steps": 340, "warmup_steps": 20}}}
    cfg = command_line.parse([])
    line = budget.resumed_length(cfg, state)
    assert (cfg.training.max_steps, cfg.training.warmup_steps) == (340, 20)
    assert line == "training.max_steps=340 (was 1000): the checkpoint's run length; give training.max_steps to change it"
    given = command_line.parse(["training.max_steps=500"])
    assert budget.resumed_length(given, state) is None and given.training.max_steps == 500
    said = dict(budget.plan(cfg, _timing(), 300, fresh=False))  # not sized again: a resume is not fresh
    assert cfg.training.max_steps == 340 and said["time"].startswith("time: 40 steps left to 340 at 1.5 s/step")


def test_a_sized_run_plans_its_length_again_from_its_own_first_steps_within_the_warmup():
    cfg = command_line.parse([])
    timing = _timing(step_s=2.0, gone_s=30.0)
    budget.plan(cfg, timing, 0, fresh=True)
    t, planned = cfg.training, cfg.training.max_steps
    assert timing.sized_from == 1000 and t.warmup_steps == planned // 10 > 10
    assert budget.replan(cfg, timing, 0, 4, 1.4, 40.0) is None and timing.sized_from  # too few steps to tell yet
    line = budget.replan(cfg, timing, 0, 10, 1.4, 45.0)  # its steps are faster than the probe said
    n, room = t.max_steps, budget.MARGIN * 600 - 45.0
    paced = budget.Timing(1.4, 2.0, 8, 16, 45.0)
    assert n > planned and paced.total_s(t, 10, n) <= room < paced.total_s(t, 10, n + 1)
    assert line == (f"training.max_steps={n} (was {planned}): its first 10 steps took 1.4 s/step, the probe said 2 s/step; "
                    f"training and the final evaluation still end within training.time_budget=10m (set "
                    f"training.max_steps=1000 for the full schedule)")
    assert timing.sized_from == 0 and budget.replan(cfg, timing, 0, 20, 0.1, 50.0) is None  # once a run
    again = command_line.parse([])
    timing = _timing(step_s=2.0, gone_s=30.0)
    budget.plan(again, timing, 0, fresh=True)
    planned = again.training.max_steps
    assert budget.replan(again, timing, 0, 10, 2.02, 50.0) is None and again.training.max_steps == planned  # as planned
    late = command_line.parse(["training.warmup_steps=5"])  # past its warmup the cosine has begun: the length stays
    timing = _timing(step_s=2.0, gone_s=30.0)
    budget.plan(late, timing, 0, fresh=True)
    assert budget.replan(late, timing, 0, 10, 0.5, 45.0) is None and timing.sized_from == 0


def test_a_run_over_an_hour_says_so_with_the_override_that_makes_it_about_an_hour():
    cfg = command_line.parse(["training.max_steps=1000"])
    timing = _timing(step_s=20.0)
    said = dict(budget.plan(cfg, timing, 0, fresh=True))
    n = timing.steps_within(cfg.training, 0, budget.HOUR)
    assert timing.total_s(cfg.training, 0, n) <= budget.HOUR < timing.total_s(cfg.training, 0, n + 1)
    assert said["time_long"] == (f"warning: this run takes about 5.6 h here (20 s/step measured, final evaluation "
                                 f"~32 s); training.max_steps={n} makes it about an hour")
    epochs = command_line.parse(["training.epochs=4", "training.max_steps=1000"])  # as resolve_epochs left it
    assert "training.epochs=" in dict(budget.plan(epochs, timing, 0, fresh=True))["time_long"]
    budgeted = command_line.parse(["training.time_budget=9h"])  # the budget's own run is long: the budget shortens it
    assert dict(budget.plan(budgeted, timing, 0, fresh=True))["time_long"].endswith(
        "; training.time_budget=1h makes it about an hour")


def test_the_eta_counts_the_steps_left_at_the_runs_pace_and_the_evaluations_to_come():
    t = command_line.parse(["training.max_steps=100", "training.eval_interval=50"]).training
    timing = _timing()
    assert budget.eta(timing, t, 40, 2.0) == budget.clock(60 * 2.0 + (8 + 16) * 2.0)  # one evaluation on the way
    assert budget.eta(timing, t, 100, 2.0) == budget.clock(16 * 2.0)  # the final evaluation
    assert [budget.clock(s) for s in (5, 460, 3720)] == ["5s", "7m40s", "1h02m"]


# ---------------------------------------------------------------- real runs, the probe's figures injected


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(1200)


def _probed(monkeypatch, step_s: float, eval_batch_s: float = 0.01) -> None:
    """This machine's probe answers ``step_s`` a step (batch 16) and ``eval_batch_s`` an evaluation batch; nothing
    has gone since the start: the plan is the same on any machine."""
    monkeypatch.setattr(train, "measure_rate", lambda *a, **kw: 16 / step_s)
    monkeypatch.setattr(budget, "time_eval_batch", lambda *a, **kw: eval_batch_s)
    monkeypatch.setattr(budget, "since_start", lambda: 0.0)


@pytest.mark.slow
def test_the_embedded_defaults_length_comes_from_the_budget_and_the_run_ends_with_its_accuracy(
        sudoku_dir, tmp_path, monkeypatch, capsys):
    _probed(monkeypatch, step_s=5.0)
    train.run(command_line.parse(tiny_args(sudoku_dir, tmp_path, "training.time_budget=1m")))
    out = capsys.readouterr().out
    n = int(re.search(r"^training.max_steps=(\d+) \(was 1000\), training.warmup_steps=1 \(was 5\) so that training "
                      r"and the final evaluation end within training.time_budget=1m: 5 s/step measured", out, re.M)[1])
    assert n == 10  # 0.85 of 60 s holds 10 steps of 5 s and the final evaluation
    assert re.search(rf"^time: {n} steps at 5 s/step = 50 s of training, ~\d+ s of evaluation: about \d+ s in all, "
                     r"until about \d\d:\d\d$", out, re.M)
    assert max(by_step(tmp_path)) == n and f"step {n}/{n} |" in out
    assert re.search(rf"^held-out exact accuracy \d\.\d{{3}} \(95% interval \d\.\d{{3}}-\d\.\d{{3}}\) on all \d+ test "
                     "puzzles", out, re.M)
    assert all(re.search(r" \| eta \d+[smh]", l) for l in out.splitlines() if l.startswith("step "))
    [event] = [e for e in records(tmp_path, "events.jsonl") if e["kind"] == "time_budget"]
    assert event["max_steps"] == n and event["step_s"] == pytest.approx(5.0)


@pytest.mark.slow
def test_an_explicit_max_steps_wins_and_a_long_one_is_warned_of(sudoku_dir, tmp_path, monkeypatch, capsys):
    _probed(monkeypatch, step_s=1000.0)
    train.run(command_line.parse(tiny_args(sudoku_dir, tmp_path, "training.max_steps=4")))
    out = capsys.readouterr().out
    assert "(was 1000)" not in out and max(by_step(tmp_path)) == 4
    assert re.search(r"^time: 4 steps at 1000 s/step = 66.7 min of training, ~\d+ s of evaluation: about 66.\d min in "
                     r"all", out, re.M)
    assert re.search(r"^warning: this run takes about 66.\d min here \(1000 s/step measured, final evaluation ~\d+ s\); "
                     r"training.max_steps=3 makes it about an hour$", out, re.M)
    lines = [l for l in out.splitlines() if l.startswith("step ")]
    assert lines[0].startswith("step 1/4 |") and lines[-1].startswith("step 4/4 |")
    assert out.index("time: 4 steps") < out.index("step 1/4")  # before the first step


def test_the_dry_runs_time_is_the_trainers_plan_timed_on_this_machine(sudoku_dir):
    from auralm.planning import timing
    from cli.launch.plan.timing import lines

    doc = timing.estimate(["model=tiny", f"data_dir={sudoku_dir}", "training.batch_size=16", "training.max_steps=5"])
    assert doc["max_steps"] == doc["given_max_steps"] == 5 and 1 <= doc["rows_timed"] <= 16
    assert doc["lines"][0].startswith(f"time: 5 steps at {budget.per_step(doc['step_s'])} = ")
    text = lines(doc)
    assert text[0].startswith("# time, from a probe on this machine (") and text[1] == "#   " + doc["lines"][0]
    sized = timing.estimate(["model=tiny", f"data_dir={sudoku_dir}", "training.batch_size=16",
                             "training.time_budget=0.001s"])  # a millisecond holds hardly anything anywhere
    assert sized["max_steps"] < 1000 and sized["lines"][0].startswith(f"training.max_steps={sized['max_steps']} "
                                                                      f"(was 1000)")
    assert lines({"lines": [], "why": "no data in data/lm here to size the run by"}) == [
        "# time: not estimated (no data in data/lm here to size the run by); the run times its steps before the "
        "first one and says it"]


@pytest.mark.slow  # hrmctl train --dry-run end to end
def test_train_dry_run_states_the_time(sudoku_dir, tmp_path):
    res = subprocess.run([sys.executable, "-m", "cli", "train", "--dry-run", "model=tiny", f"data_dir={sudoku_dir}",
                          "training.max_steps=7"], capture_output=True, text=True, timeout=180, env=python_env(),
                         cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert re.search(r"^# time, from a probe on this machine \(.*\); the run times its own ranks before its first "
                     r"step and says it again:\n#   time: 7 steps at \S+ s/step = ", res.stdout, re.M), res.stdout
    assert res.stdout.strip().splitlines()[-1].startswith("# model tiny")


@pytest.mark.slow
def test_a_run_shorter_than_the_probe_is_not_timed_beforehand(sudoku_dir, tmp_path, monkeypatch, capsys):
    """A run of a given length under the probe's passes trains at once (the probe would cost more than the run) and
    says so where the time line would be; a run of no given length, or as long as the probe, is timed."""
    def no_probe(*a, **kw):
        raise AssertionError("probed")

    monkeypatch.setattr(train, "measure_rate", no_probe)
    monkeypatch.setattr(budget, "time_eval_batch", no_probe)
    n = budget.PROBE_PASSES - 1
    train.run(command_line.parse(tiny_args(sudoku_dir, tmp_path, f"training.max_steps={n}")))
    out = capsys.readouterr().out
    assert re.search(rf"^time: {n} steps, not timed beforehand \(a run shorter than the time probe's "
                     rf"{budget.PROBE_PASSES} passes\); the progress line says its pace$", out, re.M), out
    assert max(by_step(tmp_path)) == n and out.index("not timed beforehand") < out.index(f"step 1/{n}")
    cfg = command_line.parse(tiny_args(sudoku_dir, tmp_path, f"training.max_steps={n}"))
    assert not budget.worth_probing(cfg)
    assert budget.worth_probing(command_line.parse(tiny_args(sudoku_dir, tmp_path, f"training.max_steps={n + 1}")))
    assert budget.worth_probing(command_line.parse([]))  # the budget's own run: its length comes from the probe


def test_a_recurrent_models_evaluation_batch_is_timed_on_one_segment_times_its_segments():
    """time_eval_batch runs one segment of a recurrent model's solve (each is the same forward) and multiplies by
    the segments an evaluation runs; a model without eval_segments is timed on its whole solve, a plain one on its
    forward. The segments here sleep, so the figures have a floor whatever the machine."""
    calls = []

    class Recurrent(torch.nn.Module):
        recurrent = True
        eval_segments = 8

        def solve(self, x, segments=None):
            calls.append(segments)
            time.sleep(0.05 * (segments or 3))

    class Whole(Recurrent):
        eval_segments = 0

    t = config.Config().training
    x = torch.zeros(2, 4, dtype=torch.long)
    seconds = budget.time_eval_batch(Recurrent(), x, x, t, torch.device("cpu"))
    assert calls == [1] and seconds >= 8 * 0.05, (calls, seconds)
    seconds = budget.time_eval_batch(Whole(), x, x, t, torch.device("cpu"))
    assert calls == [1, None] and seconds >= 3 * 0.05, (calls, seconds)
