"""The puzzle generator and solver behind the sudoku task."""

from __future__ import annotations

import random

from auralm.data import sudoku


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


def test_the_uniqueness_check_answers_as_counting_the_solutions_does(monkeypatch):
    """make_puzzle asks whether a blanked cell keeps the puzzle unique by refuting every other digit the cell's
    peers leave (sudoku._stays_unique), not by counting the blanked puzzle's solutions: each answer must be the
    counting's (so the puzzles, and every dataset made from a seed, stay the same), the puzzle left as it was, and
    both answers must come up."""
    real = sudoku._stays_unique
    answers = []

    def checked(puzzle, i, digit):
        before = list(puzzle)
        fast = real(puzzle, i, digit)
        assert puzzle == before and puzzle[i] == 0
        assert fast == (sudoku.count_solutions(puzzle)[0] == 1), (puzzle, i, digit)
        answers.append(fast)
        return fast

    monkeypatch.setattr(sudoku, "_stays_unique", checked)
    for seed, givens in ((1, 24), (2, 30), (3, 45)):
        puzzle, solution = sudoku.make_puzzle(random.Random(seed), givens)
        assert sudoku.count_solutions(puzzle) == (1, solution)
    assert any(answers) and not all(answers)


def test_the_fills_digit_orders_are_the_generators_own_samples():
    """random_solution draws each cell's digit order by rejection from getrandbits (sudoku._digit_orders), as
    CPython's sample does: the same orders, and the generator left in the same state, as rng.sample(range(1, 10), 9)
    from the same seed, so every dataset made from a seed stays the same."""
    assert sudoku._SAMPLE_EXACT  # this Python's sample draws as CPython's: the fast path is the one used
    for seed in range(300):
        fast, plain = random.Random(seed), random.Random(seed)
        order = sudoku._digit_orders(fast)
        assert [order() for _ in range(7)] == [plain.sample(range(1, 10), 9) for _ in range(7)], seed
        assert fast.random() == plain.random()
    assert sudoku.random_solution(random.Random(11)) != sudoku.random_solution(random.Random(12))


def test_solver_counts_several_solutions_and_none():
    empty = [0] * 81
    assert sudoku.count_solutions(empty, limit=2)[0] == 2
    clash = [5, 5] + [0] * 79
    assert sudoku.count_solutions(clash) == (0, None)


# ---------------------------------------------------------------- difficulty and rating

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from auralm.data import datadir  # noqa: E402
from auralm.data.puzzle_file import read_puzzles  # noqa: E402
from tests.trainer.helpers import prepare_data  # noqa: E402

# Arto Inkala's "hardest sudoku": 21 givens, needs search
INKALA = [int(c) for c in "800000000003600000070090200050007000000045700000100030001000068008500010090000400"]


def test_the_rater_counts_no_guess_for_a_singles_puzzle_and_several_for_a_hard_one():
    rng = random.Random(1)
    easy, solution, rating = sudoku.make_rated(rng, "easy")
    assert rating == 0 and sudoku.rate(easy) == 0
    assert sudoku.rate(INKALA) >= 5
    n, found = sudoku.count_solutions(INKALA)
    assert n == 1 and _valid(found)


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_each_difficulty_keeps_its_givens_range_and_a_unique_solution(difficulty):
    lo, hi = sudoku.DIFFICULTIES[difficulty]
    for puzzle, solution, rating in sudoku.generate_rated(4, seed=5, difficulty=difficulty):
        assert lo <= sum(1 for v in puzzle if v) <= hi
        assert sudoku.count_solutions(puzzle) == (1, solution)


def test_extreme_puzzles_have_at_most_25_givens_and_need_search():
    made = sudoku.generate_rated(2, seed=11, difficulty="extreme")
    for puzzle, solution, rating in made:
        assert 17 <= sum(1 for v in puzzle if v) <= 25
        assert sudoku.count_solutions(puzzle) == (1, solution)
        assert rating == sudoku.rate(puzzle) >= sudoku.EXTREME_MIN_GUESSES


def test_generation_does_not_depend_on_the_number_of_workers():
    assert sudoku.generate_rated(30, seed=2, difficulty="easy", workers=1) == \
        sudoku.generate_rated(30, seed=2, difficulty="easy", workers=2)


# ---------------------------------------------------------------- transforms


def test_augmented_puzzles_stay_valid_unique_and_equivalent():
    rng = random.Random(3)
    puzzle, solution, _ = sudoku.make_rated(rng, "medium")
    for _ in range(10):
        p, s = sudoku.augment(puzzle, solution, rng)
        assert _valid(s) and all(v in (0, s[i]) for i, v in enumerate(p))
        assert sudoku.count_solutions(p) == (1, s)
        assert sudoku.equivalent(puzzle, p)
    records = np.array([[puzzle, solution]] * 32, np.uint8)
    out = sudoku.augment_batch(records, np.random.default_rng(0))
    assert out.shape == records.shape
    assert len({row.tobytes() for row in out}) > 20  # each row its own transform
    for p, s in out.tolist():
        assert _valid(s) and all(v in (0, s[i]) for i, v in enumerate(p))
        assert sum(1 for v in p if v) == sum(1 for v in puzzle if v)
        assert sudoku.equivalent(puzzle, p)


def test_equivalence_tells_different_puzzles_apart():
    rng = random.Random(4)
    a, _, _ = sudoku.make_rated(rng, "medium")
    b, _, _ = sudoku.make_rated(rng, "medium")
    assert not sudoku.equivalent(a, b)
    changed = list(a)
    i = next(i for i, v in enumerate(a) if v)
    j = next(j for j in sudoku.PEERS[i] if a[j] and a[j] != a[i])
    changed[i], changed[j] = a[j], a[i]  # the same pattern, two givens swapped: not a transform
    assert not sudoku.equivalent(a, changed)


def test_the_test_split_holds_no_transform_of_a_train_puzzle():
    rng = random.Random(6)
    train = [sudoku.make_rated(rng, "medium") for _ in range(5)]
    planted = sudoku.augment(train[2][0], train[2][1], rng)
    test = [sudoku.make_rated(rng, "medium"), (planted[0], planted[1], 0), sudoku.make_rated(rng, "medium")]
    kept, removed = datadir._without_leaks(train, test)
    assert removed == 1 and planted[0] not in [p for p, *_ in kept] and len(kept) == 2


# ---------------------------------------------------------------- prepare-data and the CSV


def _csv(path, rows, header=True):
    lines = (["source,question,answer,rating"] if header else []) + rows
    path.write_text("\n".join(lines) + "\n")
    return path


def _row(puzzle, solution, rating="3"):
    return f"gen,{''.join(str(v) if v else '.' for v in puzzle)},{''.join(map(str, solution))},{rating}"


def test_prepare_writes_train_with_augmented_copies_and_an_unaugmented_test_split(tmp_path):
    out = tmp_path / "d"
    msg = datadir.prepare_sudoku(out, train=20, test=10, difficulty="medium", aug=3, seed=1, workers=1)
    assert "20 medium train puzzles x 4" in msg
    meta = datadir.load_manifest(out, "sudoku")
    assert meta["splits"]["train"]["puzzles"] == 80 and meta["splits"]["val"]["puzzles"] == 10
    assert meta["difficulty"] == "medium" and 30 <= meta["givens"]["min"] <= meta["givens"]["max"] <= 36
    train = np.fromfile(out / "train_000.bin", np.uint8).reshape(-1, 2, 81)
    for k in range(1, 4):  # copy k of puzzle i is a transform of puzzle i
        assert sudoku.equivalent(train[0, 0].tolist(), train[k * 20, 0].tolist())
    test = np.fromfile(out / "val_000.bin", np.uint8).reshape(-1, 2, 81)
    assert not any(sudoku.equivalent(t.tolist(), p.tolist()) for t in test[:, 0] for p in train[:20, 0])


def test_the_csv_is_read_checked_and_split(tmp_path):
    rng = random.Random(8)
    rows = [_row(*sudoku.make_rated(rng, "hard")[:2]) for _ in range(12)]
    out = tmp_path / "d"
    msg = datadir.prepare_sudoku(out, train=8, test=4, from_csv=str(_csv(tmp_path / "train.csv", rows)), aug=1)
    meta = datadir.load_manifest(out, "sudoku")
    assert meta["splits"]["train"]["puzzles"] == 16 and meta["splits"]["val"]["puzzles"] == 4, msg
    assert meta["source"] == {"csv": ["train.csv"]} and meta["rating"]["kind"] == "the CSV's rating"
    headerless = _csv(tmp_path / "plain.csv", [",".join(r.split(",")[1:3]) for r in rows], header=False)
    assert len(read_puzzles(str(headerless))) == 12


@pytest.mark.parametrize("bad, expected", [
    ("gen,123,456,1", "line 3: the question is not 81 characters"),
    ("gen," + "." * 81 + "," + "1" * 81 + ",1", "line 3: the answer is not a solved sudoku grid"),
    ("gen,KEEP,OTHER,1", "line 3: the answer does not keep the question's givens"),
    ("gen,GOOD,ANSWER,hard", "line 3: the rating 'hard' is not a number"),
    ("lonely", "line 3: expected the question in column 2, got 1 column(s)"),
])
def test_a_bad_csv_line_is_one_error_naming_the_line(tmp_path, capsys, bad, expected):
    rng = random.Random(9)
    puzzle, solution, _ = sudoku.make_rated(rng, "easy")
    other = sudoku.random_solution(rng)
    q = "".join(str(v) if v else "." for v in puzzle)
    bad = bad.replace("KEEP", q).replace("OTHER", "".join(map(str, other)))
    bad = bad.replace("GOOD", q).replace("ANSWER", "".join(map(str, solution)))
    path = _csv(tmp_path / "x.csv", [_row(puzzle, solution), bad])
    assert prepare_data(["--task", "sudoku", "--from-csv", str(path), "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} ") and expected in err and err.count("\n") == 1
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("args, expected", [
    (["--difficulty", "insane"], "Invalid value for '--difficulty': 'insane' is not one of 'easy', 'medium', 'hard', "
                                 "'extreme'"),
    (["--train", "0"], "Invalid value for '--train': 0 is not in the range x>=1"),
    (["--aug", "-1"], "Invalid value for '--aug': -1 is not in the range x>=0"),
    (["--from-csv", "nowhere.csv"], "nowhere.csv: no such file"),
    (["--test-csv", "t.csv"], "t.csv: no such file"),
    (["--min-givens", "20"], "--min-givens/--max-givens go with --count N"),
    (["--preset", "sudoku-hard-9"], "Invalid value for '--preset': 'sudoku-hard-9' is not one of"),
])
def test_prepare_data_bad_sudoku_options_are_one_line(tmp_path, capsys, args, expected):
    assert prepare_data(["--task", "sudoku", *args, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and expected in err and err.count("\n") == 1
