"""The puzzle generator and solver behind the sudoku task."""

from __future__ import annotations

import random

from auralm import sudoku


def _valid(grid):
    units = ([[r * 9 + c for c in range(9)] for r in range(9)] + [[r * 9 + c for r in range(9)] for c in range(9)]
             + [[(br * 3 + r) * 9 + bc * 3 + c for r in range(3) for c in range(3)] for br in range(3) for bc in range(3)])
    return all(sorted(grid[i] for i in u) == list(range(1, 10)) for u in units)


def test_random_solutions_are_valid_grids():
    rng = random.Random(0)
    grids = [sudoku.random_solution(rng) for _ in range(50)]
    assert all(_valid(g) for g in grids)
    assert len({tuple(g) for g in grids}) == 50


def test_puzzles_have_one_solution_the_given_one_and_the_asked_givens():
    puzzles, solutions = sudoku.generate(30, seed=3, min_givens=30, max_givens=40)
    for p, s in zip(puzzles, solutions):
        n, found = sudoku.count_solutions(p)
        assert n == 1 and found == s and _valid(s)
        assert all(v in (0, s[i]) for i, v in enumerate(p))
        assert 30 <= sum(1 for v in p if v) <= 40


def test_generation_is_deterministic():
    assert sudoku.generate(5, 7, 40, 50) == sudoku.generate(5, 7, 40, 50)
    assert sudoku.generate(5, 7, 40, 50) != sudoku.generate(5, 8, 40, 50)


def test_solver_counts_several_solutions_and_none():
    empty = [0] * 81
    assert sudoku.count_solutions(empty, limit=2)[0] == 2
    clash = [5, 5] + [0] * 79
    assert sudoku.count_solutions(clash) == (0, None)
