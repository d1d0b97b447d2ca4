"""Solve sudoku puzzles with a trained model: ``python -m auralm.tools.solve CHECKPOINT [FILE|-]``.

One puzzle per line, 81 characters in row-major order, ``.`` or ``0`` for a blank (blank lines and
lines starting with ``#`` are skipped). For each puzzle it prints the model's grid and whether it is
a valid solution that keeps the givens, then a summary line. Exit 0 when every grid is a valid
solution, 1 when some are not, 2 for bad input (a line that is not a puzzle, a checkpoint that is
not a sudoku model: one whose task is sudoku's grids, auralm.tasks.sudoku).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from auralm import tasks
from auralm.errors import UserError, exit_frozen
from auralm.tasks.sudoku import Sudoku


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
        grids += (preds + 1).tolist()
    return grids


def main(argv: list[str] | None = None) -> int:
    from auralm.tools.inference import load

    p = argparse.ArgumentParser(prog=os.environ.get("AURALM_PROG", "python -m auralm.tools.solve"),
                                description="Solve sudoku puzzles with a trained model.")
    p.add_argument("checkpoint", help="a checkpoint-<step> directory or a run directory")
    p.add_argument("file", nargs="?", default="-", help="puzzles, one per line (- or nothing: standard input)")
    p.add_argument("--json", action="store_true", help="one JSON object per puzzle, then a summary object")
    p.error = lambda message: (_ for _ in ()).throw(UserError(message))  # one line, not usage + message
    try:
        a = p.parse_args(argv)
        loaded = load(Path(a.checkpoint))
        if not isinstance(tasks.get(loaded.task) if loaded.task in tasks.names() else None, Sudoku):  # its grids
            raise UserError(f"{loaded.path} is a task={loaded.task} model, not a sudoku model")
        if a.file == "-":
            puzzles = parse_puzzles(sys.stdin, "standard input")
        else:
            try:
                with open(a.file) as f:
                    puzzles = parse_puzzles(f, a.file)
            except (OSError, UnicodeDecodeError) as e:
                raise UserError(f"{a.file}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    grids = solve(loaded.model, puzzles)
    solved = 0
    for puzzle, grid in zip(puzzles, grids):
        ok = is_solution(grid, puzzle)
        solved += ok
        text = "".join(map(str, grid))
        print(json.dumps({"puzzle": "".join(str(v) if v else "." for v in puzzle), "grid": text, "valid": ok})
              if a.json else f"{text} {'valid' if ok else 'INVALID'}")
    summary = {"puzzles": len(puzzles), "solved": solved, "checkpoint": str(loaded.path)}
    print(json.dumps(summary) if a.json else f"{solved} of {len(puzzles)} solved ({loaded.path})")
    return 0 if solved == len(puzzles) else 1


if __name__ == "__main__":
    exit_frozen(main())
