"""A run's state, as status.json records it and `hrmctl runs` shows it: one enum (strings, so that the JSON files
and the comparisons read them as they are). Imports the standard library only."""

from __future__ import annotations

import enum


class RunState(str, enum.Enum):
    QUEUED = "queued"  # a Slurm job not started yet (or requeued): it will run
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"  # interrupted (Ctrl-C, `hrmctl stop`, a Slurm cancel), or its launcher gone without an end
    UNKNOWN = "unknown"  # not started by hrmctl, and nothing records why its metrics stop

    __str__ = str.__str__  # "running", in f-strings and str() alike, on every Python
    __format__ = str.__format__


ENDED = (RunState.FINISHED, RunState.FAILED, RunState.STOPPED)  # an end recorded: nothing of it runs
ACTIVE = (RunState.QUEUED, RunState.RUNNING)  # it runs, or will
