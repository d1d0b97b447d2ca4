"""A stop asked of the trainer from outside, taken at a step every rank agrees on, with a checkpoint there.

Who asks: hrmctl sends SIGUSR1 to every rank when Slurm warns of the job's time limit (`--signal`), and a user may
too; inside a Slurm job (SLURM_JOB_ID set) SIGTERM asks the same, since Slurm sends SIGTERM to every process of a
job it cancels, requeues or preempts, and SIGKILL KillWait later. The handler only notes the signal. After each of
the strategy's steps (a step; a round under DiLoCo: the points where every rank stands at the same step) the ranks
agree on it with one small all-reduce, started after one step and read after the next, so that it never waits on
the network; the loop then saves a checkpoint at that step and ends, and the run resumes from it exactly
(resume=latest). On SIGTERM outside Slurm, and on every other signal, the default stands: the process ends.

Imports torch and auralm.training.distributed.
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist

from auralm.training.distributed import Dist


def save_signals() -> tuple[int, ...]:
    """The signals that ask for a checkpoint and a stop in this process."""
    return (signal.SIGUSR1, signal.SIGTERM) if os.environ.get("SLURM_JOB_ID") else (signal.SIGUSR1,)


class StopRequest:
    """``agreed()`` after every strategy step: the signal every rank now agrees to stop on (the first asked
    anywhere), or 0. Use as a context manager: the handlers are restored, and a flag in flight waited for."""

    def __init__(self, d: Dist):
        self.d = d
        self.asked = 0
        self.flag = torch.zeros(1, dtype=torch.int64)
        self.work = None
        self.epoch = 0  # the membership the flag in flight was sent in (auralm.training.members)

    def __enter__(self) -> "StopRequest":
        self.old = {}
        for s in save_signals():
            try:
                self.old[s] = signal.signal(s, self._note)
            except ValueError:  # not the main thread (a test calling train() from one): nothing to catch here
                pass
        return self

    def _note(self, signum, frame) -> None:
        self.asked = self.asked or signum

    def agreed(self) -> int:
        if self.d.world == 1:
            return self.asked
        seen = 0
        if self.work is not None:  # the flags every rank sent one step ago
            done = self.d.wait([self.work], self.epoch)
            while not done:  # a rank left meanwhile: the flag again, among those present (until none leaves during it)
                epoch = self.d.epoch
                self.flag = torch.tensor([self.asked], dtype=torch.int64)  # ``asked`` never goes back to 0
                work = dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, group=self.d.objects_group, async_op=True)
                done = self.d.wait([work], epoch)
            seen = int(self.flag.item())
        self.epoch = self.d.epoch
        self.flag = torch.tensor([self.asked], dtype=torch.int64)  # a CPU tensor: the gloo group
        self.work = dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, group=self.d.objects_group, async_op=True)
        return seen

    def __exit__(self, *exc) -> None:
        if self.work is not None and exc[0] is None:
            self.d.wait([self.work], self.epoch)  # a rank gone meanwhile: nothing to send again
        for s, h in self.old.items():
            signal.signal(s, h)


def stop_line(signum: int, step: int, max_steps: int, path) -> str:
    name = signal.Signals(signum).name
    return (f"stopped at step {step}/{max_steps} on {name}: checkpoint {path} saved; the run goes on from it with "
            f"resume=latest")
