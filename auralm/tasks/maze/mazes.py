"""Mazes made offline: the generator, the exact solver, the public files' text form, the eight symmetries of a
square.

A maze is SIZE x SIZE cells in row-major order, each an index into CHARSET, the characters of the public Maze-Hard
files (``sapientinc/maze-30x30-hard-1k``: ``source,question,answer,rating``): a wall, an open cell, the start, the
goal, and (in an answer only) a cell of the path. An answer is its question with every cell strictly between the
start and the goal on the shortest path marked ``o``; its length is the path's moves.

- Generation, like the public set's ``hard`` instances (a shortest path longer than 110 moves): a maze carved on a
  lattice of cells two apart (a depth-first walk: long corridors, one path between any two cells), then ``loops``
  walls between two cells opened so that there are routes to choose between; the start is a random open cell, the
  goal a random cell whose shortest path from it is at least ``min_path`` moves and the only one of that length
  (so a maze has one right answer, and exact accuracy means what it says). A maze without such a cell is drawn
  again.
- Solving: a breadth-first search that counts the shortest paths to each cell (up to two).
- Symmetries: rotations and reflections keep a maze a maze and its answer its answer (:func:`transform_batch`, the
  trainer's augmentation on the fly; :func:`canonical`, so that no test maze is a transform of a train maze).

numpy and the standard library only (and prepare_choices' table of the data's defaults).
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

from auralm.data.prepare_choices import MAZE_DEFAULTS

CHARSET = "# SGo"
WALL, OPEN, START, GOAL, PATH = range(5)
SIZE = 30
CELLS = SIZE * SIZE
HARD_PATH = MAZE_DEFAULTS["min_path"]  # the public Maze-Hard set's filter: a shortest path longer than 110 moves


class MazeError(ValueError):
    """A maze that has no single answer, or a text that is not a maze."""


def _neighbours(size: int) -> list[tuple[int, ...]]:
    out = []
    for u in range(size * size):
        r, c = divmod(u, size)
        out.append(tuple(v for ok, v in ((r > 0, u - size), (r < size - 1, u + size), (c > 0, u - 1),
                                         (c < size - 1, u + 1)) if ok))
    return out


NEIGHBOURS = _neighbours(SIZE)


def carve(rng: random.Random, loops: int) -> list[int]:
    """A maze's cells, WALL or OPEN: a depth-first walk over a lattice of cells two apart (its offset drawn, so that
    the edge left whole is any of the four), then ``loops`` walls between two lattice cells opened."""
    off = (rng.randrange(2), rng.randrange(2))
    k = ((SIZE - off[0] + 1) // 2, (SIZE - off[1] + 1) // 2)
    grid = [WALL] * CELLS

    def at(i: int, j: int) -> int:
        return (2 * i + off[0]) * SIZE + 2 * j + off[1]

    seen = [[False] * k[1] for _ in range(k[0])]
    i, j = rng.randrange(k[0]), rng.randrange(k[1])
    seen[i][j], grid[at(i, j)] = True, OPEN
    stack = [(i, j)]
    while stack:
        i, j = stack[-1]
        nxt = [(i + a, j + b) for a, b in ((1, 0), (-1, 0), (0, 1), (0, -1))
               if 0 <= i + a < k[0] and 0 <= j + b < k[1] and not seen[i + a][j + b]]
        if not nxt:
            stack.pop()
            continue
        a, b = rng.choice(nxt)
        seen[a][b] = True
        grid[at(a, b)] = grid[(at(a, b) + at(i, j)) // 2] = OPEN
        stack.append((a, b))
    between = [(at(i, j) + at(a, b)) // 2 for i in range(k[0]) for j in range(k[1])
               for a, b in ((i + 1, j), (i, j + 1)) if a < k[0] and b < k[1]]
    closed = [u for u in between if grid[u] == WALL]
    for u in rng.sample(closed, min(loops, len(closed))):
        grid[u] = OPEN
    return grid


def distances(grid, start: int) -> tuple[list[int], list[int]]:
    """Each cell's shortest-path moves from ``start`` (-1: unreachable) and its count of shortest paths (at most
    2: one or several)."""
    dist, count = [-1] * len(grid), [0] * len(grid)
    dist[start], count[start] = 0, 1
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v in NEIGHBOURS[u]:
            if grid[v] == WALL:
                continue
            if dist[v] < 0:
                dist[v], count[v] = dist[u] + 1, count[u]
                queue.append(v)
            elif dist[v] == dist[u] + 1:
                count[v] = min(2, count[v] + count[u])
    return dist, count


def _answer(grid, dist: list[int], goal: int) -> list[int]:
    """The question with the shortest path's inner cells marked (the goal's path is the only shortest one)."""
    answer, u = list(grid), goal
    while dist[u] > 1:
        u = next(v for v in NEIGHBOURS[u] if dist[v] == dist[u] - 1)
        answer[u] = PATH
    return answer


def make_maze(rng: random.Random, min_path: int, loops: int) -> tuple[list[int], list[int], int]:
    """(question, answer, the path's moves): a carved maze whose goal is ``min_path`` or more moves from the start
    by its only shortest path."""
    while True:
        grid = carve(rng, loops)
        start = rng.choice([u for u, v in enumerate(grid) if v == OPEN])
        dist, count = distances(grid, start)
        far = [u for u, d in enumerate(dist) if d >= min_path and count[u] == 1]
        if far:
            goal = rng.choice(far)
            grid[start], grid[goal] = START, GOAL
            return grid, _answer(grid, dist, goal), dist[goal]


def generate(count: int, seed: int, min_path: int = HARD_PATH, loops: int = 10) -> list[tuple[list, list, int]]:
    """``count`` mazes, no two the same under a symmetry: (question, answer, the path's moves)."""
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < count:
        q, a, n = make_maze(rng, min_path, loops)
        key = canonical(np.array(q, np.uint8))
        if key not in seen:
            seen.add(key)
            out.append((q, a, n))
    return out


def solve(question) -> tuple[list[int], int]:
    """(answer, the path's moves) of a question; MazeError when it has no single answer."""
    starts = [u for u, v in enumerate(question) if v == START]
    goals = [u for u, v in enumerate(question) if v == GOAL]
    if len(starts) != 1 or len(goals) != 1:
        raise MazeError(f"a maze has one start S and one goal G, this one {len(starts)} and {len(goals)}")
    if any(v == PATH for v in question):
        raise MazeError("a question has no path marked (o) in it: that is an answer")
    dist, count = distances(question, starts[0])
    if dist[goals[0]] < 0:
        raise MazeError("the goal cannot be reached from the start")
    if count[goals[0]] > 1:
        raise MazeError(f"more than one shortest path ({dist[goals[0]]} moves) leads to the goal: no single answer")
    return _answer(question, dist, goals[0]), dist[goals[0]]


def encode(text: str) -> list[int]:
    """A maze's characters as CHARSET indexes (MazeError naming the first other character)."""
    try:
        return [CHARSET.index(ch) for ch in text]
    except ValueError:
        bad = next(ch for ch in text if ch not in CHARSET)
        raise MazeError(f"{bad!r} is not a maze's character (one of {CHARSET!r})") from None


def decode(cells) -> str:
    return "".join(CHARSET[int(v)] for v in cells)


def _symmetries(grids: np.ndarray) -> list[np.ndarray]:
    """The eight images of (..., SIZE, SIZE) grids: four rotations, each also transposed."""
    out = []
    for k in range(4):
        r = np.rot90(grids, k, axes=(-2, -1))
        out += [r, np.swapaxes(r, -1, -2)]
    return out


def canonical(question: np.ndarray) -> bytes:
    """The same bytes for a maze and each of its rotations and reflections."""
    return min(s.tobytes() for s in _symmetries(question.reshape(SIZE, SIZE)))


def transform_batch(records: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n, 2, CELLS) records (question, answer), each under one of the eight symmetries drawn by ``rng``."""
    grids = records.reshape(len(records), 2, SIZE, SIZE)
    which = rng.integers(0, 8, len(records))
    images = _symmetries(grids)
    out = np.empty_like(grids)
    for k in range(8):
        out[which == k] = images[k][which == k]
    return out.reshape(records.shape)


def symmetric_copies(records: np.ndarray, copies: int) -> np.ndarray:
    """``copies`` (at most 7) images of each record other than itself, the same ones for every record."""
    images = _symmetries(records.reshape(len(records), 2, SIZE, SIZE))[1: copies + 1]
    return np.concatenate([im.reshape(records.shape) for im in images]) if images else records[:0]
