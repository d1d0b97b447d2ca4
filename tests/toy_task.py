"""A toy task registered from outside auralm, the way a task of your own is added (docs/trainer.md, "Adding a
task"): one Task class and one ``tasks.register`` call, with a model family that trains it, in a module named in
``AURALM_MODEL_PLUGINS=tests.toy_task`` (every process that reads a config imports it: hrmctl's preflight, the
trainer under torchrun, the tools). tests/unit/test_tasks.py trains it through `hrmctl train`.

The task, ``grids``: sudoku's grids read as sudoku's data are, without the augmentation, scored by whole grids under
its own accuracy key, counting the splits it opened (in the process that opened them). Its family is the toy MLP of
tests/toy_family.py under another name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from auralm import tasks
from auralm.models.registry import ModelFamily, register
from auralm.tasks.sudoku import Sudoku
from tests import toy_family


class Grids(Sudoku):
    name = "grids"
    augment = False
    accuracy = "grid_cell_acc"
    opened: list[str] = []

    def open_split(self, data_dir, meta, split, block_size):
        Grids.opened.append(split)
        return super().open_split(data_dir, meta, split, block_size)


@dataclass(frozen=True, kw_only=True)
class GridsArgs(toy_family.ToyArgs):
    family: ClassVar[str] = "toy-grids"


tasks.register("grids", Grids)
FAMILY = register(ModelFamily(name="toy-grids", title="Toy on grids", args=GridsArgs, build=toy_family.build,
                              sizes={"toy-grids-tiny": GridsArgs(**vars(toy_family.SIZES["toy-tiny"]))},
                              model_class=toy_family.model_class, tasks=("grids",), select="model=toy-grids-tiny",
                              check=toy_family.check))
