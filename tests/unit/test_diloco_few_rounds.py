"""DiLoCo's warning for a run of few rounds with the outer step's momentum (the paper's, our default)."""

from __future__ import annotations

from auralm.config import DilocoConfig
from auralm.parallel.diloco import FEW_ROUNDS, few_rounds_note


def test_a_short_run_with_the_papers_outer_step_is_told_of_the_plain_average():
    note = few_rounds_note(DilocoConfig(inner_steps=8), 144)
    assert note.startswith("warning: diloco: 18 round(s) of 8 local steps")
    assert "training.diloco.outer_lr=1 training.diloco.outer_momentum=0" in note


def test_no_warning_with_enough_rounds_or_without_momentum():
    assert few_rounds_note(DilocoConfig(inner_steps=8), 8 * FEW_ROUNDS) is None
    assert few_rounds_note(DilocoConfig(inner_steps=8), 8 * FEW_ROUNDS - 1) is not None  # 19 whole rounds
    assert few_rounds_note(DilocoConfig(inner_steps=8, outer_lr=1.0, outer_momentum=0.0), 16) is None
    assert few_rounds_note(DilocoConfig(inner_steps=50, outer_momentum=0.5), 1000 - 1) is not None
