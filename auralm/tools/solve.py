"""Solve sudoku puzzles with a trained model: ``hrmctl solve CHECKPOINT [FILE|-]`` (cli/tools/solve.py).

One puzzle per line, 81 characters in row-major order, ``.`` or ``0`` for a blank (blank lines and
lines starting with ``#`` are skipped). For each puzzle it prints the model's grid and whether it is
a valid solution that keeps the givens, then a summary line. Exit 0 when every grid is a valid
solution, 1 when some are not, 2 for bad input (a line that is not a puzzle, a checkpoint that is
not a sudoku model: one whose task is sudoku's grids, auralm.tasks.sudoku).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from auralm import tasks
from auralm.errors import UserError
from auralm.tasks.sudoku import DIGITS, Sudoku


def parse_puzzles(lines, source: str) -> list[list[int]]:
    puzzles = []
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if len(line) != 81 or any(c not in ".0123456789" for c in line):
            shown = line if len(line) <= 40 else line[:37] + "..."
            raise UserError(f"{source} line {n}: {shown!r} is not a puzzle: expected 81 characters, digits 1-9 and "
                            f"'.' or '0' for a blank (it has {len(line)})")
        puzzles.append([0 if c == "." else int(c) for c in line])
    if not puzzles:
        raise UserError(f"{source}: no puzzle in it (one per line, 81 characters)")
    return puzzles


def is_solution(grid: list[int], puzzle: list[int]) -> bool:
    """A full valid grid that keeps every given of ``puzzle``."""
    if any(p and p != g for p, g in zip(puzzle, grid)) or any(not 1 <= g <= 9 for g in grid):
        return False
    units = [[r * 9 + c for c in range(9)] for r in range(9)] + [[r * 9 + c for r in range(9)] for c in range(9)] + \
        [[(br * 3 + r) * 9 + bc * 3 + c for r in range(3) for c in range(3)] for br in range(3) for bc in range(3)]
    return all(len({grid[i] for i in unit}) == 9 for unit in units)


@torch.no_grad()
def solve(model, puzzles: list[list[int]], batch_size: int = 256) -> list[list[int]]:
    grids = []
    for b in range(0, len(puzzles), batch_size):
        x = torch.tensor(puzzles[b: b + batch_size], dtype=torch.long)
        if getattr(model, "recurrent", False):
            preds = model.solve(x)[0][-1]
        else:
            preds = model(x)[0].argmax(-1)
        # a class past the digits (model.extra_classes: the public heads' PAD and blank) is no digit: 0
        grids += [[v + 1 if v < DIGITS else 0 for v in row] for row in preds.tolist()]
    return grids


def read_puzzles(file: str) -> list[list[int]]:
    """The puzzles of ``file``, or of standard input for ``-``; one that cannot be read is one UserError."""
    if file == "-":
        return parse_puzzles(sys.stdin, "standard input")
    try:
        with open(file) as f:
            return parse_puzzles(f, file)
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{file}: cannot read it ({getattr(e, 'strerror', None) or e})") from None


def solve_file(checkpoint: Path, file: str) -> tuple[Path, list[dict]]:
    """What ``hrmctl solve`` prints (its options: cli/tools/solve.py): the checkpoint's path and, per puzzle of
    ``file``, the puzzle, the model's grid and whether it is a valid solution keeping the givens."""
    from auralm.tools.inference import load

    loaded = load(Path(checkpoint))
    task = tasks.get(loaded.task) if loaded.task in tasks.names() else None
    if not isinstance(task, Sudoku):  # its grids
        other = (f" (`hrmctl eval {loaded.path} --puzzles FILE` scores it on a file of its puzzles)"
                 if task is not None and task.solved_whole else "")
        raise UserError(f"{loaded.path} is a task={loaded.task} model, not a sudoku model{other}")
    puzzles = read_puzzles(file)
    grids = solve(loaded.model, puzzles)
    return loaded.path, [{"puzzle": "".join(str(v) if v else "." for v in puzzle), "grid": "".join(map(str, grid)),
                          "valid": is_solution(grid, puzzle)} for puzzle, grid in zip(puzzles, grids)]
