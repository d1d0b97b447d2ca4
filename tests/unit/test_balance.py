"""Work shares (auralm.parallel.balance) and the keys that select them."""

import pytest

from auralm.training import config
from auralm.errors import UserError
from auralm.parallel import balance


@pytest.mark.parametrize("total,weights,expected", [(32, [164, 82], [21, 11]), (64, [1, 1, 1], [22, 21, 21]),
                                                    (5, [100, 1, 1], [3, 1, 1]), (3, [1, 1, 1], [1, 1, 1])])
def test_split_is_proportional_sums_to_the_total_and_gives_everyone_a_row(total, weights, expected):
    assert balance.split(total, weights) == expected


def test_ddp_shares_weight_the_loss_so_the_average_is_the_global_mean():
    s = balance.decide({"node1": 0.5}, ["node0", "node1"], 16, None)
    assert s.batch == [21, 11] and s.inner_steps == [1, 1] and not s.equal
    # DDP averages the ranks' gradients: sum_r scale_r * mean_r / world == sum of all rows / B
    # each row then weighs the same: scale_r / b_r = world / B on every rank
    assert [s.loss_scale(r) / s.batch[r] for r in range(2)] == pytest.approx([2 / 32, 2 / 32])
    assert s.global_factor(1) == pytest.approx(32 / 11)


def test_diloco_shares_give_the_slower_rank_fewer_local_steps_and_weigh_the_average_by_rows():
    s = balance.decide("auto", ["a", "b", "c"], 8, 50, rates=[200.0, 100.0, 50.0])
    assert s.batch == [8, 8, 8] and s.inner_steps == [50, 25, 12]
    assert sum(s.sample_weight(r) for r in range(3)) == pytest.approx(1)
    assert s.sample_weight(0) == pytest.approx(50 / 87)
    assert s.inner_steps_for(1, 10, 50) == 5 and s.inner_steps_for(2, 1, 50) == 1


def test_equal_and_a_world_of_one_are_equal_shares():
    assert balance.decide("equal", ["a", "b"], 16, None).equal
    assert balance.decide({"x": 3.0}, ["a"], 16, None).equal


def test_the_node_comes_from_hrmctls_job_variable(monkeypatch):
    monkeypatch.setenv("HRMCTL_JOB", "20261124-1200/laptop-2")
    assert balance.node_name() == "laptop-2"


@pytest.mark.parametrize("bad", ["training.balance=node0", "training.balance=node0:0", "training.balance=:2",
                                 "training.balance=a:x", "training.balance=a:inf", "training.sync=local",
                                 "training.ddp_comm_hook=int8", "training.diloco.inner_steps=0",
                                 "training.diloco.outer_momentum=1", "training.diloco.compress=fp8",
                                 "training.diloco.overlap_steps=50", "training.diloco.overlap_steps=-1"])
def test_bad_values_are_one_error_naming_the_key(bad):
    with pytest.raises(UserError) as e:
        config.parse([bad])
    assert bad.split("=")[0] in str(e.value)


def test_a_hook_with_diloco_is_refused_and_good_values_parse():
    with pytest.raises(UserError, match="applies to training.sync=ddp"):
        config.parse(["training.sync=diloco", "training.ddp_comm_hook=bf16"])
    cfg = config.parse(["training.sync=diloco", "training.diloco.inner_steps=20", "training.balance=n0:2,n1:1"])
    assert cfg.training.diloco.inner_steps == 20 and config.parse_balance(cfg.training.balance) == {"n0": 2, "n1": 1}
