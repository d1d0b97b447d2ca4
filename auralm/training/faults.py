"""Fault injection (the ``fault.*`` keys): what a test asks a run to suffer, as hooks around the loop's step.

A run given none of the keys has no hook, and its step has nothing of this. With them, ``hooks()`` gives the rank
one ``Faults`` whose methods the step calls at its two points (auralm.training.step, ``Training.hooks``):

- ``before_step(at)``: ``fault.kill_at_step`` SIGKILLs ``fault.kill_rank`` (only in a run that did not resume: a
  restart, which passes resume=latest, gets past it), and ``fault.step_sleep`` makes every rank (or
  ``fault.sleep_rank``, from step ``fault.sleep_from_step`` on) a slower machine;
- ``after_backward(at, params)``: ``fault.nan_at_step`` puts NaN into ``fault.nan_rank``'s gradients; it returns
  whether it did, so that the step does not read the NaN as an fp16 overflow.

Each says what it does on the rank's standard error.
"""

from __future__ import annotations

import os
import signal
import sys
import time


class Faults:
    def __init__(self, fault, rank: int, resumed: bool):
        self.fault, self.rank, self.resumed = fault, rank, resumed

    def before_step(self, at: int) -> None:
        f = self.fault
        if self.rank == f.kill_rank and at in f.kill_at_step and not self.resumed:
            print(f"fault: killing rank {self.rank} at step {at}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if f.step_sleep > 0 and f.sleep_rank in (-1, self.rank) and at >= f.sleep_from_step:
            if at == f.sleep_from_step > 0:
                print(f"fault: rank {self.rank} sleeps {f.step_sleep:g}s a step from step {at} on", file=sys.stderr,
                      flush=True)
            time.sleep(f.step_sleep)

    def after_backward(self, at: int, params) -> bool:
        f = self.fault
        if self.rank != f.nan_rank or at not in f.nan_at_step:
            return False
        print(f"fault: NaN in rank {self.rank}'s gradients at step {at}", file=sys.stderr, flush=True)
        params[0].grad.fill_(float("nan"))
        return True


def hooks(fault, rank: int, resumed: bool) -> list[Faults]:
    """The rank's fault hooks: none unless a fault.* key asks for one."""
    asked = fault.kill_at_step or fault.step_sleep > 0 or fault.nan_at_step
    return [Faults(fault, rank, resumed)] if asked else []
