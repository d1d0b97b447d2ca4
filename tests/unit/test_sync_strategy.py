"""The sync strategies' registry (auralm.parallel.strategy): a mode registered from outside auralm/parallel/ is
chosen by its name and is what the trainer steps with; the names config.py accepts are the registry's; the
built-in names choose their classes (DDP alone: the single process)."""

from __future__ import annotations

import pytest
import torch

from auralm.training import checkpoint, config, distributed, train
from auralm.errors import UserError
from auralm.parallel import strategy
from auralm.parallel.ddp import DataParallel
from auralm.parallel.diloco_strategy import DiLoCoRounds
from auralm.parallel.fsdp_strategy import Sharded
from auralm.parallel.single import Single
from tests.trainer.helpers import records, tiny_args

pytestmark = pytest.mark.usefixtures("one_thread")


class CountingSteps(Single):
    """A new sync mode, one class: the single-process strategy, counting the steps the trainer asks of it and
    what it saved."""

    steps = 0
    saves = 0

    def advance(self, loop_step):
        CountingSteps.steps += 1
        return super().advance(loop_step)

    def attach(self, training, ckpt, loop_step) -> None:
        super().attach(training, ckpt, loop_step)
        ckpt.register("counting", get=self.saved, put=lambda state: None)  # its own part of every checkpoint

    @staticmethod
    def saved() -> dict:
        CountingSteps.saves += 1
        return {"steps": CountingSteps.steps}


@pytest.fixture
def counting():
    strategy.register("counting", CountingSteps)  # the one registration
    CountingSteps.steps = CountingSteps.saves = 0
    yield CountingSteps
    strategy.unregister("counting")


def _weights(model: torch.nn.Module) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_strategy_registered_outside_auralm_parallel_is_the_one_the_trainer_steps_with(counting, sudoku_data,
                                                                                        tmp_path):
    data_dir = sudoku_data(1200)
    common = ["training.max_steps=4", "training.checkpoint_interval=2"]
    mine = train.run(config.parse(tiny_args(data_dir, tmp_path / "counting", *common, "training.sync=counting")))
    assert counting.steps == 4 and counting.saves == 2  # every step and checkpoint of the run went through it
    assert [r["step"] for r in records(tmp_path / "counting")] == [1, 2, 3, 4]
    assert config.parse(["training.sync=counting"]).training.sync == "counting"
    assert checkpoint.read_extra(tmp_path / "counting" / "checkpoint-4", "counting") == {"steps": 4}
    # it steps as the single process it extends: the same weights as the built-in mode alone
    builtin = train.run(config.parse(tiny_args(data_dir, tmp_path / "ddp", *common)))
    a, b = _weights(mine), _weights(builtin)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_unregistered_name_is_refused_with_the_registered_ones(counting):
    assert strategy.names("sync") == ("ddp", "diloco", "counting")
    strategy.unregister("counting")
    with pytest.raises(UserError, match=r"training.sync='counting': expected one of ddp, diloco$"):
        config.parse(["training.sync=counting"])
    with pytest.raises(UserError, match=r"training.parallel='diloco': expected one of ddp, fsdp$"):
        config.parse(["training.parallel=diloco"])


def test_the_built_in_names_choose_their_classes():
    assert strategy.choose("ddp", "ddp", 2) is DataParallel
    assert strategy.choose("ddp", "ddp", 1) is Single  # DDP alone: nothing to synchronise
    assert strategy.choose("diloco", "ddp", 2) is DiLoCoRounds and strategy.choose("diloco", "ddp", 1) is DiLoCoRounds
    assert strategy.choose("ddp", "fsdp", 2) is Sharded and strategy.choose("ddp", "fsdp", 1) is Sharded


def test_a_single_process_strategy_is_refused_in_a_world_of_several(counting):
    cfg = config.parse(["training.sync=counting"])
    with pytest.raises(UserError, match=r"^training.sync=counting trains a single process, and this run has 2 "
                                        r"ranks: run it alone, or choose another training.sync$"):
        strategy.make(cfg, distributed.Dist(rank=0, world=2))


def test_the_link_budget_asks_the_strategy_what_it_sends_each_step():
    budget = {"ddp": {"comm_s": 1.0}, "ddp_bf16": {"comm_s": 0.5}, "ddp_powersgd": None}
    assert strategy.strategy_class("ddp").link_cost(budget, "bf16") is budget["ddp_bf16"]
    assert strategy.strategy_class("ddp").link_cost(budget, "powersgd") is None  # no PowerSGD figures
    assert strategy.strategy_class("ddp", "fsdp").link_cost(budget, "none") is budget["ddp"]
    assert strategy.strategy_class("diloco").link_cost(budget, "none") is None  # a round's sync, not a step's


def test_what_a_mode_declares_in_its_registration_is_what_the_launcher_and_the_config_check_read():
    """A new mode's traits are one registration: whether a node leaves it in place (the launcher's min_nodes and
    in-place leave), a key of its own (refused under another mode), a setting it refuses; no name is tested."""
    from cli.launch.plan.min_nodes import in_place, min_nodes
    from cli.launch.plan.options import LaunchOptions

    def trainer(args):  # the trainer's reading of the overrides, as a launch gives it to its stages
        return LaunchOptions(nodes=[], args=args).trainer

    strategy.register("roaming", CountingSteps, in_place=True, owns=("powersgd_rank",), refuses=(("ema", True),),
                      about="it roams")
    try:
        roaming, ddp = trainer(["training.sync=roaming"]), trainer(["training.sync=ddp"])
        assert min_nodes(roaming, 3) == 1 and in_place(roaming, 3)
        assert min_nodes(ddp, 3) == 3 and not in_place(ddp, 3)
        assert config.parse(["training.sync=roaming", "training.ema=false"]).training.sync == "roaming"
        with pytest.raises(UserError, match=r"^training.sync=roaming cannot be combined with training.ema=true: it "
                                            r"roams \(drop training.ema, or choose another training.sync\)$"):
            config.parse(["training.sync=roaming", "training.ema=true"])
        with pytest.raises(UserError, match=r"^training.sync=ddp cannot be combined with training.powersgd_rank=4, "
                                            r"which applies to training.sync=roaming \(drop training.powersgd_rank, "
                                            r"or choose training.sync=roaming\)$"):
            config.parse(["training.powersgd_rank=4"])
        with pytest.raises(UserError, match=r"^training.parallel=fsdp cannot be combined with training.sync=roaming"):
            config.parse(["training.sync=roaming", "training.parallel=fsdp"])
    finally:
        strategy.unregister("roaming")
    # the built-in modes' declarations, as the checks read them
    with pytest.raises(UserError, match=r"training.sync=diloco cannot be combined with training.ddp_comm_hook=bf16, "
                                        r"which applies to training.sync=ddp: its rounds are sent as "):
        config.parse(["training.sync=diloco", "training.ddp_comm_hook=bf16"])
    with pytest.raises(UserError, match=r"training.sync=ddp cannot be combined with training.fsdp_cpu_offload=true, "
                                        r"which applies to training.parallel=fsdp"):
        config.parse(["training.fsdp_cpu_offload=true"])
    for bad in ("training.dtype=fp16", "training.ema=true"):
        with pytest.raises(UserError, match=rf"^training.parallel=fsdp cannot be combined with {bad}: FSDP shards"):
            config.parse(["training.parallel=fsdp", bad])

