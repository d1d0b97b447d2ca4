"""Puzzle files in the common text forms, read for `hrmctl eval --puzzles` and `prepare-data --from-csv`: a task
gives its ``Form`` (what a question and an answer look like, and its exact solver); this reads the lines.

A file holds one puzzle a line (sudoku: 81 characters in row-major order, ``0`` or ``.`` for a blank), and optionally
its solution after a comma (and a rating after that). A CSV with a header names its columns: the question is the
column called question, quizzes, quiz, puzzle or puzzles (the public Sudoku-Extreme and Maze-Hard sets'
``source,question,answer,rating``, Kaggle's ``quizzes,solutions`` and ``puzzle,solution``), the answer answer(s) or
solution(s), the rating rating or difficulty; other columns are left alone. Without a header, the first column
holding a question is the question and the next one the answer. Blank lines and lines starting with ``#`` that are
not a question (a maze's first cell may be a wall, ``#``) are skipped.

A puzzle without a solution is solved by the task's exact solver, which also proves it has only one; every line is
checked, and the first that is not a puzzle is one PuzzleFileError naming the file and the line.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from typing import Callable

from auralm.data import sudoku

QUESTION = ("question", "questions", "quizzes", "quiz", "puzzle", "puzzles")
ANSWER = ("answer", "answers", "solution", "solutions")
RATING = ("rating", "difficulty")
SOLVE_IN_PARALLEL = 2000  # unsolved puzzles from which the solver runs on every core (about 1.4 ms a sudoku)

Row = tuple[list[int], list[int], float | None]


class PuzzleFileError(ValueError):
    """A line of a puzzle file that is not a puzzle; the message names the file and the line."""


@dataclass(frozen=True)
class Form:
    """A task's puzzles as text."""
    what: str  # what a question is, in the messages: "81 characters, digits 1-9 and '.' or '0' for a blank"
    question: Callable[[str], list | None]  # a question's cells, None when the text is not one
    answer: Callable[[str, list], list]  # the answer's cells, checked against the question (ValueError: why not)
    solve: Callable[[list], tuple[list | None, str]]  # (the one solution, "") or (None, why there is none); a
    #                                                   module-level function: it runs in a pool on many puzzles


def _sudoku_grid(text: str, blanks: str) -> list[int] | None:
    text = text.strip()
    if len(text) != 81 or any(ch not in "123456789" + blanks for ch in text):
        return None
    return [0 if ch in blanks else int(ch) for ch in text]


def _sudoku_answer(text: str, puzzle: list[int]) -> list[int]:
    solution = _sudoku_grid(text, "")
    if solution is None or not sudoku.is_valid_grid(solution):
        raise ValueError("the answer is not a solved sudoku grid (81 digits 1-9, every row, column and box once each)")
    if any(p and p != s for p, s in zip(puzzle, solution)):
        raise ValueError("the answer does not keep the question's givens")
    return solution


def _sudoku_solve(puzzle: list[int]) -> tuple[list[int] | None, str]:
    count, solution = sudoku.count_solutions(puzzle)  # up to 2: proves one
    if count == 1:
        return solution, ""
    return None, ("the puzzle has no solution" if count == 0 else
                  "the puzzle has more than one solution: give the one to score against after a comma")


SUDOKU = Form("81 characters, digits 1-9 and '.' or '0' for a blank", lambda text: _sudoku_grid(text, ".0"),
              _sudoku_answer, _sudoku_solve)


def _header(row: list[str]) -> tuple[int, int | None, int | None] | None:
    names = [c.strip().lower() for c in row]

    def at(choices):
        return next((i for i, name in enumerate(names) if name in choices), None)

    q_at = at(QUESTION)
    return None if q_at is None else (q_at, at(ANSWER), at(RATING))


def _columns(row: list[str], form: Form, where: str) -> tuple[int, int | None, int | None]:
    q_at = next((i for i, cell in enumerate(row) if form.question(cell) is not None), None)
    if q_at is None:
        raise PuzzleFileError(f"{where}: not a puzzle: expected {form.what} (and its solution after a comma), or a "
                              "CSV header naming a question column")
    return q_at, (q_at + 1 if q_at + 1 < len(row) else None), (q_at + 2 if q_at + 2 < len(row) else None)


def _row(row: list[str], columns, form: Form, where: str) -> tuple[list[int], list[int] | None, float | None]:
    q_at, a_at, r_at = columns
    if len(row) <= q_at:
        raise PuzzleFileError(f"{where}: expected the question in column {q_at + 1}, got {len(row)} column(s)")
    puzzle = form.question(row[q_at])
    if puzzle is None:
        raise PuzzleFileError(f"{where}: the question is not {form.what}")
    solution = None
    if a_at is not None and a_at < len(row) and row[a_at].strip():
        try:
            solution = form.answer(row[a_at], puzzle)
        except ValueError as e:
            raise PuzzleFileError(f"{where}: {e}") from None
    rating = None
    if r_at is not None and r_at < len(row) and row[r_at].strip():
        try:
            rating = float(row[r_at])
        except ValueError:
            raise PuzzleFileError(f"{where}: the rating {row[r_at]!r} is not a number") from None
    return puzzle, solution, rating


def read_puzzles(path: str, workers: int | None = None, form: Form = SUDOKU) -> list[Row]:
    """(puzzle, solution, rating or None) for every puzzle of ``path`` in ``form``; those without a solution solved
    here (on ``workers`` processes when there are many; None: every core)."""
    rows, lines, columns = [], [], None
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            for row in reader:
                where = f"{path} line {reader.line_num}"
                if not row or all(not c.strip() for c in row) or (
                        row[0].lstrip().startswith("#") and form.question(row[0]) is None):  # a comment, not a maze
                    continue
                if columns is None:
                    columns = _header(row)
                    if columns is not None:
                        continue
                    columns = _columns(row, form, where)
                rows.append(_row(row, columns, form, where))
                lines.append(where)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise PuzzleFileError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if not rows:
        raise PuzzleFileError(f"{path}: no puzzle in it (one a line: {form.what})")
    unsolved = [i for i, (_, solution, _) in enumerate(rows) if solution is None]
    if unsolved:
        puzzles = [rows[i][0] for i in unsolved]
        workers = workers or os.cpu_count() or 1
        if workers > 1 and len(puzzles) >= SOLVE_IN_PARALLEL:
            import multiprocessing

            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                found = pool.map(form.solve, puzzles, chunksize=256)
        else:
            found = [form.solve(p) for p in puzzles]
        for i, (solution, why) in zip(unsolved, found):
            if solution is None:
                raise PuzzleFileError(f"{lines[i]}: {why}")
            rows[i] = (rows[i][0], solution, rows[i][2])
    return rows
