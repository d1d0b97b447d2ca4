"""Lock-step timing of the trainer against peers: at each of the trainer's optimizer steps every peer takes one
step of its own, in a rotating order, so a slow spell of the machine falls on all of them alike."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from torch.optim.optimizer import register_optimizer_step_post_hook

if TYPE_CHECKING:  # the peers' type only
    from bench.train_throughput import BareLoop


class LockStep:
    """At each of the trainer's optimizer steps, every peer takes one step; times the trainer between them."""

    def __init__(self, warmup: int, clock=time.thread_time):
        self.warmup, self.peers, self.busy, self.clock = warmup, {}, False, clock  # clock: as the peers' (clock_for)
        self.steps, self.trainer_seconds, self.left = 0, 0.0, None
        register_optimizer_step_post_hook(self)

    def start(self, peers: dict[str, BareLoop]) -> None:
        self.peers, self.steps, self.trainer_seconds, self.left = peers, 0, 0.0, None

    def __call__(self, optimizer, *_):
        if self.busy or not self.peers or any(optimizer is p.opt for p in self.peers.values()):
            return
        now = self.clock()
        self.steps += 1
        if self.left is not None and self.steps > self.warmup:
            self.trainer_seconds += now - self.left
        self.busy = True
        names = list(self.peers)
        turn = self.steps % len(names)
        for name in names[turn:] + names[:turn]:
            self.peers[name].step(timed=self.steps > self.warmup)
        self.busy = False
        self.left = self.clock()
