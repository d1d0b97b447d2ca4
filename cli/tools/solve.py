"""`hrmctl solve`: sudoku puzzles solved by a trained model (auralm.tools.solve.solve_file)."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.tools.common import Checkpoint, user_errors


def solve(checkpoint: Checkpoint,
          file: Annotated[str, typer.Argument(
              metavar="FILE", help="Puzzles, one per line: 81 characters, '.' or '0' for a blank (- or nothing: "
                                     "standard input).")] = "-",
          json_out: Annotated[bool, typer.Option("--json", help="One JSON object per puzzle, then a summary object.")]
          = False) -> int:
    """Solve sudoku puzzles (one per line, 81 characters) with a trained model.

    Prints each puzzle's grid and whether it is a valid solution that keeps the givens, then a summary.
    Exit 0 when every grid is a valid solution, 1 when some are not, 2 for bad input."""
    import json

    with user_errors():
        from auralm.tools.solve import solve_file

        path, results = solve_file(checkpoint, file)
    for r in results:
        print(json.dumps(r) if json_out else f"{r['grid']} {'valid' if r['valid'] else 'INVALID'}")
    solved = sum(r["valid"] for r in results)
    summary = {"puzzles": len(results), "solved": solved, "checkpoint": str(path)}
    print(json.dumps(summary) if json_out else f"{solved} of {len(results)} solved ({path})")
    return 0 if solved == len(results) else 1
