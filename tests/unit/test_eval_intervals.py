"""The 95% intervals `hrmctl eval` gives each accuracy (auralm.tools.evaluate): Wilson's for whole grids, the
clustered ratio estimator's for cells; and the puzzle files' solver on several processes."""

from __future__ import annotations

import random

import pytest
import torch

from auralm.tools.evaluate import ratio_interval, wilson


def test_wilson_matches_the_published_interval_and_stays_in_0_1():
    assert wilson(81, 100) == pytest.approx([0.7222, 0.8749], abs=1e-4)  # the textbook score interval
    lo, hi = wilson(0, 30)
    assert lo == 0 and 0.10 < hi < 0.12  # no success: still an upper bound, not [0, 0]
    assert wilson(30, 30)[1] == 1 and wilson(0, 0) == [0.0, 1.0]
    assert wilson(870, 1000)[1] - wilson(870, 1000)[0] == pytest.approx(0.042, abs=0.002)  # issue 66's +-2 points


def _coverage(correlated: bool, trials: int = 400, samples: int = 60, cells: int = 50, p: float = 0.8) -> float:
    g = torch.Generator().manual_seed(3)
    covered = 0
    for _ in range(trials):
        if correlated:  # each sample's cells all right or all wrong
            right = (torch.rand(samples, generator=g) < p).long() * cells
        else:
            right = (torch.rand(samples, cells, generator=g) < p).sum(1)
        lo, hi = ratio_interval(right, torch.full((samples,), cells))
        covered += lo <= p <= hi
    return covered / trials


@pytest.mark.parametrize("correlated", [False, True])
def test_the_cell_interval_covers_the_true_rate_95_percent_of_the_time_even_when_a_grids_cells_go_together(correlated):
    """A binomial interval over all cells would be 7 times too narrow when a grid's cells are right or wrong together
    (50 cells a grid): its coverage would be about a third. The clustered one holds 95% either way."""
    assert 0.92 <= _coverage(correlated) <= 0.98


def test_a_cell_interval_of_grids_that_go_together_is_as_wide_as_the_grids_share():
    right = torch.tensor([50] * 40 + [0] * 10)
    lo, hi = ratio_interval(right, torch.full((50,), 50))
    w_lo, w_hi = wilson(40, 50)
    assert hi - lo == pytest.approx(w_hi - w_lo, rel=0.25)


def test_puzzles_without_solutions_are_solved_on_several_processes(tmp_path, monkeypatch):
    from auralm.data import puzzle_file, sudoku

    rng = random.Random(4)
    made = [sudoku.make_puzzle(rng, 30) for _ in range(6)]
    path = tmp_path / "p.txt"
    path.write_text("".join("".join(map(str, p)) + "\n" for p, _ in made))
    monkeypatch.setattr(puzzle_file, "SOLVE_IN_PARALLEL", 4)
    rows = puzzle_file.read_puzzles(str(path), workers=2)
    assert [(p, s) for p, s, _ in rows] == [(p, s) for p, s in made]
