"""Sudoku puzzles made offline: a generator of puzzles with a unique solution, and the solver it uses.

A grid is a list of 81 ints in row-major order, 0 for a blank cell. Difficulty is the number of
givens: fewer givens, harder puzzle.
"""

from __future__ import annotations

import random

ALL = 0x3FE  # bits 1..9
_ROW = [i // 9 for i in range(81)]
_COL = [i % 9 for i in range(81)]
_BOX = [(i // 27) * 3 + (i % 9) // 3 for i in range(81)]


def count_solutions(grid: list[int], limit: int = 2) -> tuple[int, list[int] | None]:
    """Count solutions up to ``limit``; also return the first one found (None if there is none)."""
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    for i, v in enumerate(grid):
        if v:
            bit = 1 << v
            if (rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]]) & bit:
                return 0, None  # the givens already clash
            rows[_ROW[i]] |= bit
            cols[_COL[i]] |= bit
            boxes[_BOX[i]] |= bit
    cells = list(grid)
    blanks = [i for i, v in enumerate(cells) if not v]
    found: list[list[int]] = []

    def search(count: int) -> int:
        # Most constrained blank first; a cell with no candidate ends this branch.
        best, best_free, best_n = -1, 0, 10
        for i in blanks:
            if cells[i]:
                continue
            free = ALL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
            n = bin(free).count("1")
            if n < best_n:
                best, best_free, best_n = i, free, n
                if n <= 1:
                    break
        if best < 0:
            if not found:
                found.append(list(cells))
            return count + 1
        r, c, b = _ROW[best], _COL[best], _BOX[best]
        free = best_free
        while free and count < limit:
            bit = free & -free
            free ^= bit
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            cells[best] = bit.bit_length() - 1
            count = search(count)
            cells[best] = 0
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
        return count

    n = search(0)
    return n, (found[0] if found else None)


def random_solution(rng: random.Random) -> list[int]:
    """A full valid grid: the canonical pattern under random digit, row, column and band permutations."""
    digits = list(range(1, 10))
    rng.shuffle(digits)

    def order() -> list[int]:
        bands = rng.sample(range(3), 3)
        return [b * 3 + r for b in bands for r in rng.sample(range(3), 3)]

    rows, cols = order(), order()
    grid = [digits[(3 * (r % 3) + r // 3 + c) % 9] for r in rows for c in cols]
    if rng.random() < 0.5:  # transpose
        grid = [grid[c * 9 + r] for r in range(9) for c in range(9)]
    return grid


def make_puzzle(rng: random.Random, givens: int) -> tuple[list[int], list[int]]:
    """A puzzle with a unique solution and (at least, near) ``givens`` givens, and its solution.

    Cells are blanked in random order, each kept only if the solution stays unique; when no more
    can go the puzzle keeps more givens than asked (rare above 25 givens).
    """
    solution = random_solution(rng)
    puzzle = list(solution)
    filled = 81
    for i in rng.sample(range(81), 81):
        if filled <= givens:
            break
        puzzle[i] = 0
        if count_solutions(puzzle)[0] == 1:
            filled -= 1
        else:
            puzzle[i] = solution[i]
    return puzzle, solution


def generate(count: int, seed: int, min_givens: int, max_givens: int) -> tuple[list[list[int]], list[list[int]]]:
    """``count`` puzzles and their solutions, the same for the same arguments."""
    rng = random.Random(seed)
    puzzles, solutions = [], []
    for _ in range(count):
        p, s = make_puzzle(rng, rng.randint(min_givens, max_givens))
        puzzles.append(p)
        solutions.append(s)
    return puzzles, solutions
