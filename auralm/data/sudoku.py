"""Sudoku puzzles made offline: the generator, a rater, the validity-preserving transforms, the equivalence of two
puzzles (the puzzle files' reader: auralm.data.puzzle_file).

A grid is a list of 81 ints in row-major order, 0 for a blank cell.

- Generation: a full grid by a randomised fill, then cells blanked in random order, each kept blank
  only if the solution stays unique. ``DIFFICULTIES`` names the givens range; ``extreme`` blanks
  until no more cell can go (a minimal puzzle), and keeps it only with at most 25 givens and a
  rating of at least ``EXTREME_MIN_GUESSES``.
- Rating: :func:`rate` solves with constraint propagation (naked and hidden singles) and counts the
  guesses its search makes to find the solution and prove it unique; 0 means singles alone solve it.
- Transforms that keep a puzzle valid (and its solution unique): digit relabelling, transposition,
  band permutation, row-within-band, stack permutation, column-within-stack. :func:`augment` for one
  puzzle, :func:`augment_batch` for a batch of records with numpy (the trainer's on-the-fly augmentation).
- Equivalence: :func:`equivalent` tells whether one puzzle is a transform of another, exactly
  (invariants first, :func:`signature`, then a search over the symmetry group), so a test split can
  be kept free of every train puzzle's transforms.
"""

from __future__ import annotations

import itertools
import random

import numpy as np

from auralm.data.prepare_choices import DIFFICULTIES  # name -> (min, max givens); extreme is also rated (make_puzzle)

ALL = 0x3FE  # bits 1..9
_ROW = [i // 9 for i in range(81)]
_COL = [i % 9 for i in range(81)]
_BOX = [(i // 27) * 3 + (i % 9) // 3 for i in range(81)]
UNITS = ([[r * 9 + c for c in range(9)] for r in range(9)] + [[r * 9 + c for r in range(9)] for c in range(9)]
         + [[(br * 3 + r) * 9 + bc * 3 + c for r in range(3) for c in range(3)] for br in range(3) for bc in range(3)])
PEERS = [sorted({j for u in UNITS if i in u for j in u} - {i}) for i in range(81)]

EXTREME_MIN_GUESSES = 2  # an extreme puzzle needs at least this many guesses of the rater's search


def is_valid_grid(grid) -> bool:
    return all(sorted(grid[i] for i in u) == list(range(1, 10)) for u in UNITS)


def count_solutions(grid: list[int], limit: int = 2) -> tuple[int, list[int] | None]:
    """Count solutions up to ``limit``; also return the first one found (None if there is none)."""
    n, first, _ = _search(grid, limit)
    return n, first


def rate(grid: list[int]) -> int:
    """Guesses the search makes, with naked and hidden singles propagated at every node, to find the solution and
    prove it unique (0: singles alone solve the puzzle)."""
    return _search(grid, 2)[2]


def _search(grid: list[int], limit: int) -> tuple[int, list[int] | None, int]:
    """(solutions up to ``limit``, the first, guesses made). Singles are propagated at every node."""
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    cells = list(grid)
    for i, v in enumerate(cells):
        if v:
            bit = 1 << v
            if (rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]]) & bit:
                return 0, None, 0  # the givens already clash
            rows[_ROW[i]] |= bit
            cols[_COL[i]] |= bit
            boxes[_BOX[i]] |= bit
    found: list[list[int]] = []
    guesses = [0]

    def place(i, v, trail):
        bit = 1 << v
        cells[i] = v
        rows[_ROW[i]] |= bit
        cols[_COL[i]] |= bit
        boxes[_BOX[i]] |= bit
        trail.append(i)

    def undo(trail):
        for i in trail:
            bit = 1 << cells[i]
            rows[_ROW[i]] ^= bit
            cols[_COL[i]] ^= bit
            boxes[_BOX[i]] ^= bit
            cells[i] = 0

    def propagate(trail) -> int:
        """Place naked and hidden singles until none is left. -1: contradiction; else the best cell to branch on
        (-2: solved)."""
        while True:
            progress, best, best_n = False, -2, 10
            for i in range(81):
                if cells[i]:
                    continue
                free = ALL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
                if not free:
                    return -1
                if free & (free - 1) == 0:
                    place(i, free.bit_length() - 1, trail)
                    progress = True
                else:
                    n = bin(free).count("1")
                    if n < best_n:
                        best, best_n = i, n
            if progress:
                continue
            for unit in UNITS:  # hidden singles: a digit with one place left in a unit
                where: dict[int, int] = {}
                seen = 0
                for i in unit:
                    if cells[i]:
                        seen |= 1 << cells[i]
                        continue
                    free = ALL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
                    for v in range(1, 10):
                        if free >> v & 1:
                            where[v] = -1 if v in where else i
                for v in range(1, 10):
                    if not seen >> v & 1:
                        i = where.get(v)
                        if i is None:
                            return -1  # the digit has no place left in this unit
                        if i >= 0 and not cells[i]:
                            free = ALL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
                            if not free >> v & 1:
                                return -1
                            place(i, v, trail)
                            progress = True
                if progress:
                    break
            if not progress:
                return best

    def search(count: int) -> int:
        trail: list[int] = []
        best = propagate(trail)
        if best == -2:
            if not found:
                found.append(list(cells))
            count += 1
        elif best >= 0:
            free = ALL & ~(rows[_ROW[best]] | cols[_COL[best]] | boxes[_BOX[best]])
            while free and count < limit:
                bit = free & -free
                free ^= bit
                guesses[0] += 1
                inner: list[int] = []
                place(best, bit.bit_length() - 1, inner)
                count = search(count)
                undo(inner)
        undo(trail)
        return count

    n = search(0)
    return n, (found[0] if found else None), guesses[0]


def _digit_orders(rng: random.Random):
    """A function giving ``rng.sample(range(1, 10), 9)``: the same lists from the same generator state, at about a
    third of its cost (the fill below asks for one at every cell it tries, 130 a grid) where this Python's sample
    draws as CPython's does (checked at import, ``_SAMPLE_EXACT``), else its own sample."""
    return _orders_by_rejection(rng) if _SAMPLE_EXACT else (lambda: rng.sample(range(1, 10), 9))


def _orders_by_rejection(rng: random.Random):
    """CPython's sample of 9 from 9: ``_randbelow(9 - i)`` for i in 0..8, each by rejection from ``getrandbits`` of
    the bound's bit length, the pick swapped with the pool's last free element."""
    getrandbits = rng.getrandbits

    def order() -> list[int]:
        pool = [1, 2, 3, 4, 5, 6, 7, 8, 9]
        out = []
        for n in (9, 8, 7, 6, 5, 4, 3, 2, 1):
            k = _BITS[n]
            j = getrandbits(k)
            while j >= n:
                j = getrandbits(k)
            out.append(pool[j])
            pool[j] = pool[n - 1]
        return out

    return order


_BITS = [n.bit_length() for n in range(10)]
_SAMPLE_EXACT = all(_orders_by_rejection(random.Random(seed))() == random.Random(seed).sample(range(1, 10), 9)
                    for seed in range(64))


def random_solution(rng: random.Random) -> list[int]:
    """A full valid grid, by a randomised fill (cells in order, digits in random order, with backtracking)."""
    cells = [0] * 81
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    digits = _digit_orders(rng)

    def fill(i: int) -> bool:
        if i == 81:
            return True
        r, c, b = _ROW[i], _COL[i], _BOX[i]
        for v in digits():
            bit = 1 << v
            if (rows[r] | cols[c] | boxes[b]) & bit:
                continue
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            cells[i] = v
            if fill(i + 1):
                return True
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
        cells[i] = 0
        return False

    fill(0)
    return cells


def make_puzzle(rng: random.Random, givens: int) -> tuple[list[int], list[int]]:
    """A puzzle with a unique solution and (at least, near) ``givens`` givens, and its solution.

    Cells are blanked in random order, each kept blank only if the solution stays unique; when no more
    can go the puzzle keeps more givens than asked (usual below 24 givens: the puzzle is then minimal).
    """
    solution = random_solution(rng)
    puzzle = list(solution)
    filled = 81
    for i in rng.sample(range(81), 81):
        if filled <= givens:
            break
        puzzle[i] = 0
        if _stays_unique(puzzle, i, solution[i]):
            filled -= 1
        else:
            puzzle[i] = solution[i]
    return puzzle, solution


def _stays_unique(puzzle: list[int], i: int, digit: int) -> bool:
    """Whether a puzzle that was unique with ``digit`` given in cell ``i`` stays unique with the cell blank: whether
    no solution puts another digit there. A second solution keeping ``digit`` would have been one of the puzzle
    before, so this is the same answer as counting the blanked puzzle's solutions, found by trying each other digit
    the cell's row, column and box leave (none left: nothing to try) and looking for any solution with it, which
    propagation mostly refutes at once, without finding the known solution again first (about half the work)."""
    seen = 0
    for j in PEERS[i]:
        seen |= 1 << puzzle[j]
    others = ALL & ~seen & ~(1 << digit)
    while others:
        bit = others & -others
        others ^= bit
        puzzle[i] = bit.bit_length() - 1
        found = _search(puzzle, 1)[0]
        puzzle[i] = 0
        if found:
            return False
    return True


def make_rated(rng: random.Random, difficulty: str) -> tuple[list[int], list[int], int]:
    """A puzzle of ``difficulty``, its solution and its rating. ``extreme``: tries minimal puzzles until one has
    at most 25 givens and needs at least EXTREME_MIN_GUESSES guesses."""
    lo, hi = DIFFICULTIES[difficulty]
    while True:
        puzzle, solution = make_puzzle(rng, lo if difficulty == "extreme" else rng.randint(lo, hi))
        givens = sum(1 for v in puzzle if v)
        if difficulty != "extreme":
            return puzzle, solution, rate(puzzle)
        if givens <= hi:
            r = rate(puzzle)
            if r >= EXTREME_MIN_GUESSES:
                return puzzle, solution, r


def _make_batch(args: tuple[str, int, int]) -> list[tuple[list[int], list[int], int]]:
    difficulty, seed, count = args
    rng = random.Random(seed)
    return [make_rated(rng, difficulty) for _ in range(count)]


def generate_rated(count: int, seed: int, difficulty: str, workers: int = 1) -> list[tuple[list[int], list[int], int]]:
    """``count`` (puzzle, solution, rating) of ``difficulty``: the same for the same seed, whatever ``workers``
    (puzzles are made in fixed chunks of 25, each from its own seed)."""
    chunks = [(difficulty, seed * 1_000_003 + k, min(25, count - k * 25)) for k in range(-(-count // 25))]
    if workers > 1 and len(chunks) > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(workers) as pool:
            parts = pool.map(_make_batch, chunks)
    else:
        parts = [_make_batch(c) for c in chunks]
    return [p for part in parts for p in part]


def generate(count: int, seed: int, min_givens: int, max_givens: int) -> tuple[list[list[int]], list[list[int]]]:
    """``count`` puzzles and their solutions with a givens count in the range, the same for the same arguments."""
    rng = random.Random(seed)
    puzzles, solutions = [], []
    for _ in range(count):
        p, s = make_puzzle(rng, rng.randint(min_givens, max_givens))
        puzzles.append(p)
        solutions.append(s)
    return puzzles, solutions


# ---------------------------------------------------------------- transforms


def random_transform(rng) -> tuple[list[int], list[int]]:
    """(cell map, digit map): new cell i takes old cell ``cells[i]``; digit d becomes ``digits[d]`` (0 stays 0)."""
    bands = rng.sample(range(3), 3)
    rows = [b * 3 + r for b in bands for r in rng.sample(range(3), 3)]
    stacks = rng.sample(range(3), 3)
    cols = [s * 3 + c for s in stacks for c in rng.sample(range(3), 3)]
    cells = [rows[r] * 9 + cols[c] for r in range(9) for c in range(9)]
    if rng.random() < 0.5:
        cells = [cells[c * 9 + r] for r in range(9) for c in range(9)]
    digits = [0] + rng.sample(range(1, 10), 9)
    return cells, digits


def augment(puzzle: list[int], solution: list[int], rng: random.Random) -> tuple[list[int], list[int]]:
    """The puzzle and its solution under one random validity-preserving transform."""
    cells, digits = random_transform(rng)
    return [digits[puzzle[j]] for j in cells], [digits[solution[j]] for j in cells]


def augment_batch(records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Records (B, 2, 81) uint8 (puzzle, solution), each under its own random transform, vectorised."""
    B = records.shape[0]
    perm3 = np.array(list(itertools.permutations(range(3))))  # the 6 orders of 3
    bands = perm3[rng.integers(0, 6, B)]  # (B, 3)
    within = perm3[rng.integers(0, 6, (B, 3))]  # (B, 3, 3)
    rows = (bands[:, :, None] * 3 + within).reshape(B, 9)
    stacks = perm3[rng.integers(0, 6, B)]
    cwithin = perm3[rng.integers(0, 6, (B, 3))]
    cols = (stacks[:, :, None] * 3 + cwithin).reshape(B, 9)
    cells = rows[:, :, None] * 9 + cols[:, None, :]  # (B, 9, 9): new (r, c) takes old cells[r, c]
    flip = rng.random(B) < 0.5
    cells[flip] = cells[flip].transpose(0, 2, 1)
    cells = cells.reshape(B, 81)
    digits = np.concatenate([np.zeros((B, 1), np.uint8), np.argsort(rng.random((B, 9)), axis=1).astype(np.uint8) + 1],
                            axis=1)  # (B, 10): 0 stays 0
    moved = np.take_along_axis(records, cells[:, None, :].repeat(2, axis=1), axis=2)
    return np.take_along_axis(digits[:, None, :].repeat(2, axis=1), moved.astype(np.int64), axis=2)


# ---------------------------------------------------------------- equivalence under the transforms


def _digit_profile(p) -> tuple:
    return tuple(sorted(p.count(d) for d in range(1, 10)))


def signature(p: list[int]) -> tuple:
    """An invariant of the transforms: equal for equivalent puzzles (so unequal ones are different puzzles)."""

    def side(q):
        counts = [sum(1 for c in range(9) if q[r * 9 + c]) for r in range(9)]
        return tuple(sorted(tuple(sorted(counts[b * 3: b * 3 + 3])) for b in range(3)))

    t = [p[c * 9 + r] for r in range(9) for c in range(9)]
    return tuple(sorted((side(p), side(t)))) + (_digit_profile(p),)


def _orders() -> list[list[int]]:
    out = []
    for bands in itertools.permutations(range(3)):
        for within in itertools.product(itertools.permutations(range(3)), repeat=3):
            out.append([bands[k] * 3 + within[k][j] for k in range(3) for j in range(3)])
    return out


_ORDERS = _orders()  # the 1,296 row (or column) orders of the group


def equivalent(a: list[int], b: list[int]) -> bool:
    """Whether ``b`` is ``a`` under some transform (exact: a search over rows, columns, transposition, digits)."""
    if signature(a) != signature(b):
        return False
    brows = [b[r * 9: r * 9 + 9] for r in range(9)]
    bmask = [[1 if v else 0 for v in row] for row in brows]
    bcount = [sum(m) for m in bmask]
    for src in (a, [a[c * 9 + r] for r in range(9) for c in range(9)]):
        arows = [src[r * 9: r * 9 + 9] for r in range(9)]
        acount = [sum(1 for v in row if v) for row in arows]
        for rows in _ORDERS:
            if [acount[r] for r in rows] != bcount:
                continue
            placed = [arows[r] for r in rows]
            colsets = [tuple(1 if placed[r][c] else 0 for r in range(9)) for c in range(9)]
            bcols = [tuple(bmask[r][c] for r in range(9)) for c in range(9)]
            for cols in _ORDERS:
                if any(colsets[cols[c]] != bcols[c] for c in range(9)):
                    continue
                mapping: dict[int, int] = {}
                ok = True
                for r in range(9):
                    for c in range(9):
                        v = placed[r][cols[c]]
                        if v and mapping.setdefault(v, brows[r][c]) != brows[r][c]:
                            ok = False
                            break
                    if not ok:
                        break
                if ok and len(set(mapping.values())) == len(mapping):
                    return True
    return False
