"""--dry-run's time: auralm.planning.timing (the trainer's own probes and plan, on this machine), asked of the launch's
plan process (planner.py) after the size estimate; the lines a run says before its first step (its time to max_steps, what
training.time_budget sets max_steps to, the warning of a run over an hour), said here before anything starts."""

from __future__ import annotations

from cli.launch.plan import planner
from cli.launch.plan.options import TRAINER

TIMING_TIMEOUT_S = 120


def start(opts, world: int) -> planner.Answer | None:
    """The trainer's time estimate for this run, asked now; None for another module."""
    if opts.module != TRAINER:
        return None
    return planner.ask("time", TIMING_TIMEOUT_S, args=list(opts.args), world=world)


def summary(aside: planner.Answer | None) -> dict | None:
    """--json's "time": the estimate's document, or {"lines": [], "why": ...} when there is none."""
    if aside is None:
        return None
    doc = aside.result()
    if doc is not None:
        return doc
    why = (f"not estimated within {TIMING_TIMEOUT_S} s here" if aside.late else aside.error or "the estimate failed")
    return {"lines": [], "why": why}


def lines(doc: dict | None) -> list[str]:
    """The dry run's text lines of the time."""
    if doc is None:
        return []
    if not doc["lines"]:
        return [f"# time: not estimated ({doc['why']}); the run times its steps before the first one and says it"]
    timed = (f"{doc['rows_timed']} of {doc['batch_size']} rows timed, scaled" if doc["rows_timed"] < doc["batch_size"]
             else f"{doc['batch_size']} rows timed")
    head = (f"# time, from a probe on this machine ({doc['host']}, {doc['device']}, a random batch: {timed}); the run "
            f"times its own ranks before its first step and says it again:")
    return [head, *(f"#   {line}" for line in doc["lines"])]
