"""How long a run takes, said before its first step, and ``training.time_budget``.

Before the first step every rank times its training with the probe the work shares use (``measure_rate``: a few
forward and backward passes of its micro-batch, after an untimed one, the weights, gradients, carries and random
state left as found) and one evaluation batch (``time_eval_batch``: the model's forward at evaluation; of a recurrent
model one segment, times the segments of its solve); the ranks gather their figures and take the slowest. From them a
``Timing`` gives the run's time to ``training.max_steps``: its steps, the evaluations on the way
(``training.eval_batches`` each) and the final one (sudoku: every test puzzle). ``plan`` says it in one line, warns
in one more when the run takes over an hour (with the override that shortens it), and, for a fresh run whose length
nobody gave (no ``training.max_steps`` nor ``training.epochs``, from the command line or a config file, in any
spelling), lowers max_steps so that training and the final evaluation end within ``training.time_budget`` (default 10
minutes) of the trainer's start, with MARGIN of it planned (the machine's load can change, and the optimizer's step,
the data and the checkpoints are not in the probe). Every rank computes the same figures, so they agree on the
max_steps; the warmup+cosine schedule reads max_steps at every step (auralm.training.optim.lr_at), so it follows the
new length. A resumed run keeps its checkpoint's length unless one is given (``resumed_length``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from auralm.training import config
from auralm.training.precision import autocast, rng_state, set_rng_state

MARGIN = 0.85  # of the budget, the share a run plans to use
HOUR = 3600.0  # a run longer than this says so, with the override that shortens it
PROBE_PASSES = 4  # measure_rate's forward and backward passes (one untimed, then three timed)
PROBE_ENOUGH_S = 1.0  # timed passes stop once they add up to this: a large model's one pass says its pace
LENGTH_KEYS = ("training.epochs", "training.max_steps")  # a run's length, when given, is not the budget's to set
# (epochs first: when both are given, epochs sets max_steps)


def duration(seconds: float) -> str:
    """``40 s``, ``8.6 min``, ``6.1 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def per_step(seconds: float) -> str:
    """A step's seconds: ``1.52 s/step``, ``1243 s/step``."""
    return f"{seconds:.3g} s/step" if seconds < 100 else f"{seconds:.0f} s/step"


def steps_text(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def clock(seconds: float) -> str:
    """A remaining time as the progress line shows it: ``12s``, ``7m40s``, ``1h02m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


_started = [time.monotonic()]  # the trainer's start (auralm.training.train.run marks it): the budget counts from it


def mark_start(process: bool = False) -> None:
    """The trainer starts now, or (``process``: the command line's) when this process started: its imports count."""
    if process:
        import psutil

        _started[0] = time.monotonic() - max(0.0, time.time() - psutil.Process().create_time())
    else:
        _started[0] = time.monotonic()


def since_start() -> float:
    """Seconds since the trainer started (its data, model and probe are in the budget too)."""
    return time.monotonic() - _started[0]


# ---------------------------------------------------------------- the probes


def measure_rate(objective, model, train_set, t: config.TrainingConfig, device: torch.device) -> float:
    """This rank's training speed in rows/s: a few forward and backward passes on the first rows of the
    split, timed after one untimed pass (three, or fewer once PROBE_ENOUGH_S is timed: hrm-50m's pass takes seconds
    here, and a second and third of them only made `--dry-run` and a run's start longer); the weights, gradients,
    carries and random state are left as found."""
    rng = rng_state(device)
    x, y = train_set.batch(list(range(min(t.batch_size, len(train_set)))))
    x, y = x.to(device), y.to(device)
    timed, began = 0, 0.0
    for i in range(PROBE_PASSES):
        if i == 1:
            began = time.perf_counter()
        with autocast(t, device):
            loss, _ = objective.loss(model, x, y, 0)
        loss.backward()
        timed += i >= 1
        if timed and time.perf_counter() - began >= PROBE_ENOUGH_S:
            break
    seconds = time.perf_counter() - began
    model.zero_grad(set_to_none=True)
    objective.reset()
    set_rng_state(rng, device)
    return len(x) * timed / seconds


@torch.no_grad()
def time_eval_batch(model, x: torch.Tensor, y: torch.Tensor, t: config.TrainingConfig, device: torch.device) -> float:
    """Seconds of one evaluation batch: the model's forward at evaluation (a recurrent model: every segment of its
    solve, timed as one segment times their number: each segment is the same forward, and hrm-27m's 16 took 3 s of
    a 6 s dry run here), the random state and the training mode left as found."""
    was, rng = model.training, rng_state(device)
    model.eval()
    try:
        recurrent = getattr(model, "recurrent", False)
        segments = getattr(model, "eval_segments", 0) if recurrent else 0  # 0: a model that does not say: all of it
        began = time.perf_counter()
        with autocast(t, device):
            model.solve(x, segments=1 if segments else None) if recurrent else model(x, y)
        return (time.perf_counter() - began) * max(1, segments)
    finally:
        model.train(was)
        set_rng_state(rng, device)


def eval_batches(task: str, n_val: int, t: config.TrainingConfig) -> tuple[int, int]:
    """(batches of an evaluation during training, of the final one): the final one of a task scored by whole
    samples (sudoku's exact accuracy) is the whole split."""
    from auralm import tasks

    whole = max(1, math.ceil(n_val / t.batch_size))
    return min(t.eval_batches, whole), whole if tasks.get(task).solved_whole else min(t.eval_batches, whole)


# ---------------------------------------------------------------- the run's time


@dataclass
class Timing:
    step_s: float  # a training step of the slowest rank (its compute: the probe's passes x grad_accum)
    eval_batch_s: float  # one evaluation batch
    each_batches: int  # an evaluation's batches during training
    final_batches: int  # the final evaluation's
    gone_s: float = 0.0  # since the trainer started, when the figures were gathered
    ranks: int = 1
    sized_from: int = 0  # the length the budget lowered (0: it did not): the first steps may plan again (replan)

    def evals(self, t: config.TrainingConfig, start: int, steps: int) -> int:
        """The evaluations during training after ``start`` and before the final one at ``steps``."""
        iv = t.eval_interval
        return max(0, (steps - 1) // iv - start // iv) if iv else 0

    def eval_s(self, t: config.TrainingConfig, start: int, steps: int) -> float:
        return (self.evals(t, start, steps) * self.each_batches + self.final_batches) * self.eval_batch_s

    def total_s(self, t: config.TrainingConfig, start: int, steps: int) -> float:
        return (steps - start) * self.step_s + self.eval_s(t, start, steps)

    def steps_within(self, t: config.TrainingConfig, start: int, seconds: float, most: int = 0) -> int:
        """The most steps (at most ``most``, else t.max_steps; at least start + 1) whose run from ``start`` takes
        ``seconds``."""
        lo, hi = start + 1, max(start + 1, most or t.max_steps)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.total_s(t, start, mid) <= seconds else (lo, mid - 1)
        return lo

    def describe(self) -> str:
        return f"{per_step(self.step_s)} measured, final evaluation ~{duration(self.final_batches * self.eval_batch_s)}"


def explicit_length(cfg: config.Config) -> str:
    """The key that gave the run's length (``training.epochs``, which wins, or ``training.max_steps``), or "" when none
    did: typed on the command line or in a config file (in any spelling: ``cfg.given_keys`` holds ours)."""
    given = [k for k in LENGTH_KEYS if k in cfg.given_keys]
    return next((k for k in given if k != "training.epochs" or cfg.training.epochs), "")


def worth_probing(cfg: config.Config) -> bool:
    """Whether the run times itself before its first step: not when its length was given and it is shorter than
    the probe (fewer steps than PROBE_PASSES: the probe would cost more than the training it times; the progress
    line's ETA comes from the run's own steps)."""
    return not explicit_length(cfg) or cfg.training.max_steps >= PROBE_PASSES


def unprobed_line(cfg: config.Config) -> str:
    """What a run too short for the probe says instead of its time."""
    return (f"time: {steps_text(cfg.training.max_steps)}, not timed beforehand (a run shorter than the time probe's "
            f"{PROBE_PASSES} passes); the progress line says its pace")


def resumed_length(cfg: config.Config, state: dict | None) -> str | None:
    """A resumed run whose length nobody gave goes on to its checkpoint's max_steps (with its warmup unless given),
    not to the default's or to a new budget's: the line saying so, or None when nothing changed."""
    t = cfg.training
    saved = ((state or {}).get("config") or {}).get("training") or {}
    if not saved or explicit_length(cfg) or saved.get("max_steps", t.max_steps) == t.max_steps:
        return None
    was, t.max_steps = t.max_steps, saved["max_steps"]
    if "training.warmup_steps" not in cfg.given_keys:
        t.warmup_steps = saved.get("warmup_steps", t.warmup_steps)
    return (f"training.max_steps={t.max_steps} (was {was}): the checkpoint's run length; give training.max_steps "
            f"to change it")


def plan(cfg: config.Config, timing: Timing, start: int, fresh: bool) -> list[tuple[str, str]]:
    """The run's time to max_steps as (kind, line) for the log; for a ``fresh`` run of no given length, max_steps
    (and a warmup longer than a tenth of it) first lowered to fit training.time_budget. Sets them in ``cfg``."""
    t = cfg.training
    budget = config.parse_budget(t.time_budget)
    out = []
    sized = bool(fresh and budget and not explicit_length(cfg))  # the budget's own run: the budget shortens it
    if sized:
        chosen = fit_budget(cfg, timing, start, budget)
        if chosen:
            out.append(("time_budget", chosen))
    total = timing.total_s(t, start, t.max_steps)
    ends = time.strftime("%H:%M", time.localtime(time.time() + total))
    left = f"{steps_text(t.max_steps - start)} left to {t.max_steps}" if start else steps_text(t.max_steps)
    out.append(("time", f"time: {left} at {per_step(timing.step_s)} = {duration((t.max_steps - start) * timing.step_s)}"
                        f" of training, ~{duration(timing.eval_s(t, start, t.max_steps))} of evaluation: about "
                        f"{duration(total)} in all, until about {ends}"
                        + (f" (the slowest of {timing.ranks} ranks' compute; communication not included)"
                           if timing.ranks > 1 else "")))
    if total > HOUR:
        out.append(("time_long", long_run_line(cfg, timing, start, total, sized)))
    return out


def fit_budget(cfg: config.Config, timing: Timing, start: int, budget: float) -> str | None:
    """Lower max_steps (and a warmup longer than a tenth of it) so that the run ends within MARGIN of ``budget`` from
    the trainer's start; the line that says so, or None when the run fits as it is."""
    t = cfg.training
    full = timing.total_s(t, start, t.max_steps)
    if timing.gone_s + full <= MARGIN * budget:
        return None
    was, warmup = t.max_steps, t.warmup_steps
    t.max_steps = timing.steps_within(t, start, MARGIN * budget - timing.gone_s)
    timing.sized_from = was
    if t.warmup_steps > t.max_steps // 10:
        t.warmup_steps = max(1, t.max_steps // 10)
    warm = f", training.warmup_steps={t.warmup_steps} (was {warmup})" if t.warmup_steps != warmup else ""
    over = timing.gone_s + timing.total_s(t, start, t.max_steps) > budget
    return (f"training.max_steps={t.max_steps} (was {was}){warm} so that training and the final evaluation end within "
            f"training.time_budget={t.time_budget}{' (here not even that fits it)' if over else ''}: "
            f"{timing.describe()}, {duration(timing.gone_s)} since the start; "
            f"set training.max_steps={was} for the full schedule (about {duration(full)})")


REPLAN_AFTER = 5  # steps: the budget's length is planned again from the run's own pace after this many (or more)


def replan_due(timing: Timing | None, start: int, step: int) -> bool:
    """Whether this log step is the one where a run the budget sized plans its length again (see replan)."""
    return bool(timing and timing.sized_from and step - start >= REPLAN_AFTER)


def replan(cfg: config.Config, timing: Timing, start: int, step: int, pace_s: float, gone_s: float) -> str | None:
    """A run the budget sized, at its first log step within the warmup (whose lr does not depend on max_steps, so the
    schedule is the one the new length would have had from the start): max_steps planned again from the pace of
    its steps so far (``pace_s``, the slowest rank's) instead of the probe's, at most the length it was lowered from;
    the line that says so, or None when it is within 5% of the plan (or this is not that step). Once a run."""
    t = cfg.training
    budget = config.parse_budget(t.time_budget)
    if not replan_due(timing, start, step):
        return None
    full, timing.sized_from = timing.sized_from, 0
    if not budget or step > t.warmup_steps:
        return None
    paced = Timing(pace_s, timing.eval_batch_s, timing.each_batches, timing.final_batches, gone_s, timing.ranks)
    steps = paced.steps_within(t, step, MARGIN * budget - gone_s, most=full)
    if abs(steps - t.max_steps) <= t.max_steps // 20:
        return None
    was, t.max_steps = t.max_steps, steps
    return (f"training.max_steps={steps} (was {was}): its first {step - start} steps took {per_step(pace_s)}, "
            f"the probe said {per_step(timing.step_s)}; training and the final evaluation still end within "
            f"training.time_budget={t.time_budget} (set training.max_steps={full} for the full schedule)")


def long_run_line(cfg: config.Config, timing: Timing, start: int, total: float, budgeted: bool) -> str:
    """The warning for a run over an hour, with the override that makes it about an hour."""
    t = cfg.training
    if budgeted:
        fix = "training.time_budget=1h"
    else:
        steps = timing.steps_within(t, start, HOUR)
        fix = (f"training.epochs={t.epochs * steps / t.max_steps:.3g}" if explicit_length(cfg) == "training.epochs"
               else f"training.max_steps={steps}")
    return f"warning: this run takes about {duration(total)} here ({timing.describe()}); {fix} makes it about an hour"


def eta(timing: Timing | None, t: config.TrainingConfig, step: int, step_s: float) -> str:
    """The progress line's remaining time: the steps left at ``step_s`` (the run's own pace so far) and the
    evaluations still to come at the probe's figure."""
    left = (t.max_steps - step) * step_s + (timing.eval_s(t, step, t.max_steps) if timing else 0.0)
    return clock(left)
