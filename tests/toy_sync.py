"""A toy sync mode registered from outside auralm, the way a mode of your own is added (docs/trainer.md, "Adding a
sync mode"): one class and one ``strategy.register`` call, in a module named in ``AURALM_MODEL_PLUGINS`` (every
process that reads a config imports it: hrmctl's preflight, the trainer under torchrun on every rank).
tests/trainer/test_toy_sync.py trains it through `hrmctl train` on two ranks.

The mode, ``training.sync=counting``: DDP's, counting the ranks' meetings (the loop's steps it advanced), keeping
the count in every checkpoint as a part of its own, and saying at the run's start what it is. Registered by
``module:Class`` so that importing this module imports no torch (hrmctl's own process reads the config too); the
class is made when the registry first asks for it."""

from __future__ import annotations

from functools import cache

from auralm.parallel import strategy


@cache
def _counting_class() -> type:
    from auralm.parallel.ddp import DataParallel

    class Counting(DataParallel):
        name = "counting"

        def attach(self, training, ckpt, loop_step) -> None:
            super().attach(training, ckpt, loop_step)
            self.advanced = 0
            ckpt.register("counting", get=lambda: {"advanced": self.advanced},
                          put=lambda saved: setattr(self, "advanced", saved["advanced"]))

        def say_start(self, log, step: int) -> None:
            log.say(f"sync: counting, DDP's steps counted (rank {self.d.rank} of {self.d.world})")

        def advance(self, loop_step):
            self.advanced += 1
            return super().advance(loop_step)

    return Counting


def __getattr__(name: str):
    if name == "Counting":
        return _counting_class()
    raise AttributeError(name)


strategy.register("counting", "tests.toy_sync:Counting", about="a toy: DDP's steps, counted")
