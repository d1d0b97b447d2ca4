"""DiLoCo's outer step by the run's length (training.diloco.outer_lr=auto, the default), explicit values kept, and the
warning for a run of few rounds with an outer momentum the user gave."""

from __future__ import annotations

import pytest
import torch

from auralm.training import config
from auralm.training.config import DilocoConfig
from auralm.training.distributed import Dist
from auralm.errors import UserError
from auralm.planning.link_budget import FEW_ROUNDS
from auralm.parallel.diloco import PAPER, PLAIN, DiLoCo, choose_outer_step, few_rounds_note


def _chosen(max_steps: int, inner_steps: int = 8, **given) -> tuple[tuple[float, float], str]:
    cfg = DilocoConfig(inner_steps=inner_steps, **given)
    said = choose_outer_step(cfg, max_steps)
    return (cfg.outer_lr, cfg.outer_momentum), said


def test_auto_is_the_default_and_is_spelled_auto():
    d = config.parse(["training.sync=diloco"]).training.diloco
    assert (d.outer_lr, d.outer_momentum) == (None, None)
    d = config.parse(["training.diloco.outer_lr=0.35", "training.diloco.outer_lr=auto",
                      "training.diloco.outer_momentum=AUTO"]).training.diloco
    assert (d.outer_lr, d.outer_momentum) == (None, None)
    d = config.parse(["training.diloco.outer_lr=0.35", "training.diloco.outer_momentum=0.5"]).training.diloco
    assert (d.outer_lr, d.outer_momentum) == (0.35, 0.5)
    with pytest.raises(UserError, match=r"^training.diloco.outer_lr='fast': expected a number or auto$"):
        config.parse(["training.diloco.outer_lr=fast"])
    with pytest.raises(UserError, match=r"training.diloco.outer_lr=0.0: must be greater than 0"):
        config.parse(["training.diloco.outer_lr=0"])
    with pytest.raises(UserError, match=r"training.diloco.outer_momentum=1.0: must be in \[0, 1\)"):
        config.parse(["training.diloco.outer_momentum=1"])


def test_auto_takes_the_plain_average_below_few_rounds_and_the_papers_step_from_there():
    step, said = _chosen(48)  # 6 rounds of 8
    assert step == PLAIN == (1.0, 0.0)
    assert said.startswith("outer step: the ranks' plain average (lr 1, momentum 0), chosen by "
                           "training.diloco.outer_lr=auto for 6 round(s) of 8 local steps (fewer than 20")
    assert "1.7% above DDP's val loss, the paper's step 5.4%" in said
    assert "training.diloco.outer_lr=0.7 training.diloco.outer_momentum=0.9" in said  # how to get the paper's
    assert _chosen(8 * FEW_ROUNDS - 1)[0] == PLAIN  # 19 whole rounds
    step, said = _chosen(8 * FEW_ROUNDS)
    assert step == PAPER == (0.7, 0.9)
    assert said == ("outer step: the paper's Nesterov SGD (lr 0.7, momentum 0.9), chosen by training.diloco.outer_lr="
                    "auto for 20 round(s) of 8 local steps (at least 20)")
    assert _chosen(1000, inner_steps=50)[0] == PAPER and _chosen(999, inner_steps=50)[0] == PLAIN


def test_given_values_are_kept_and_a_half_given_takes_the_rest_of_its_step():
    assert _chosen(48, outer_lr=0.7, outer_momentum=0.9) == ((0.7, 0.9), "outer step: the paper's Nesterov SGD "
                                                                         "(lr 0.7, momentum 0.9), as given")
    assert _chosen(8000, outer_lr=1.0, outer_momentum=0.0)[0] == PLAIN  # many rounds: still as given
    step, said = _chosen(48, outer_lr=0.35)
    assert step == (0.35, 0.9) and said.endswith("the given training.diloco.outer_lr=0.35 with the paper's momentum "
                                                  "(outer_momentum=auto)")
    assert _chosen(8000, outer_momentum=0.0)[0] == PLAIN
    assert _chosen(48, outer_momentum=0.5)[0] == (0.7, 0.5)


def test_the_warning_is_for_a_given_momentum_on_a_short_run_only():
    cfg = DilocoConfig(inner_steps=8)
    choose_outer_step(cfg, 144)
    assert few_rounds_note(cfg, 144) is None  # auto averaged: nothing to warn of
    cfg = DilocoConfig(inner_steps=8, outer_lr=0.7, outer_momentum=0.9)
    choose_outer_step(cfg, 144)
    note = few_rounds_note(cfg, 144)
    assert note.startswith("warning: diloco: 18 round(s) of 8 local steps")
    assert "training.diloco.outer_lr=1 training.diloco.outer_momentum=0, or leave both at auto" in note
    assert few_rounds_note(cfg, 8 * FEW_ROUNDS) is None
    assert few_rounds_note(DilocoConfig(inner_steps=8, outer_lr=1.0, outer_momentum=0.0), 16) is None
    assert few_rounds_note(DilocoConfig(inner_steps=50, outer_lr=0.7, outer_momentum=0.5), 1000 - 1) is not None


def test_a_resume_takes_this_runs_outer_step_and_keeps_the_saved_momentum():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    first = DiLoCo(model, DilocoConfig(outer_lr=1.0, outer_momentum=0.9, compress="none"), Dist(), 1.0)
    with torch.no_grad():
        model.weight.add_(0.1)
    first.start(0, 0.0, 0, carry=False)
    first.finish()  # one outer step: a momentum buffer
    saved = first.state_dict()
    again = DiLoCo(model, DilocoConfig(outer_lr=0.7, outer_momentum=0.5, compress="none"), Dist(), 1.0)
    again.load_state_dict(saved)
    group = again.outer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"]) == (0.7, 0.5, True)
    buffers = [again.outer.state[p]["momentum_buffer"] for p in again.shared]
    assert all(torch.equal(a, b) for a, b in zip(buffers, (first.outer.state[p]["momentum_buffer"]
                                                           for p in first.shared)))
