"""`hrmctl eval` and `hrmctl solve` (cli/tools/, running auralm.tools.evaluate and auralm.tools.solve) on a checkpoint
of a real short HRM run."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from auralm.training import train
from auralm.training.command_line import parse
from tests.trainer.helpers import PYTHON, REPO, python_env

# a real HRM run, its tools called in this process, hrmctl's processes in one test, and dry runs of hrmctl train:
# the whole suite runs it, scripts/test.sh --fast does not
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory, sudoku_data):
    base = tmp_path_factory.mktemp("hrm")
    data_dir = sudoku_data(300)  # the session's puzzles (read only)
    out = base / "run"
    train.run(parse([f"data_dir={data_dir}", f"out_dir={out}", "model=hrm-tiny", "model.n_embd=32",
                     "model.halt_max_steps=3", "model.eval_segments=3", "training.batch_size=16", "training.max_steps=4",
                     "training.eval_interval=0", "training.ema=true"]))
    return data_dir, out


def cli(module: str, *args: str, stdin: str | None = None, cwd=None):
    return subprocess.run([PYTHON, "-m", module, *args], capture_output=True, text=True, input=stdin, timeout=120,
                          env=python_env(), cwd=cwd or REPO)


@pytest.fixture
def tool(monkeypatch, capsys):
    """tool(command, *args, stdin=None): ``hrmctl command args`` in this process (its exit code, stdout, stderr)
    without a new Python and torch import per call. The processes themselves:
    test_hrmctl_eval_and_solve_run_the_trainers_tools."""
    import io
    from types import SimpleNamespace

    from cli.app import main

    def call(command: str, *args: str, stdin: str | None = None):
        capsys.readouterr()
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin or ""))
        code = main([command, *args])
        got = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=got.out, stderr=got.err)

    return call


def test_eval_reports_exact_and_cell_accuracy_halting_and_accuracy_by_segments(run, tool):
    base, out = run
    res = tool("eval", str(out), "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["checkpoint"].endswith("checkpoint-4") and r["split"] == "val" and r["examples"] == 30
    assert 0 <= r["exact_accuracy"] <= 1 and 0 < r["cell_acc"] <= 1
    assert len(r["exact_by_segments"]) == 3 and r["exact_by_segments"][-1] == r["exact_accuracy"]
    assert 1 <= r["halt_steps"] <= 3


def test_each_accuracy_has_its_95_percent_interval_in_the_json_and_the_text(run, tool):
    base, out = run
    r = json.loads(tool("eval", str(out), "--json").stdout)
    assert set(r["ci95"]) == {"exact_accuracy", "exact_accuracy_qhalt", "cell_acc"}
    for key, (lo, hi) in r["ci95"].items():
        assert 0 <= lo <= r[key] <= hi <= 1 and hi - lo > 0.01, (key, lo, hi)  # 30 puzzles: wide
    text = tool("eval", str(out)).stdout
    lo, hi = r["ci95"]["exact_accuracy"]
    assert re.search(rf"^exact_accuracy +{r['exact_accuracy']:.4f}  \(95% interval {lo:.4f}-{hi:.4f}\)$", text, re.M)
    assert "ci95" not in text


def _val_records(data_dir):
    from auralm.data import datadir

    return datadir.Puzzles(data_dir, datadir.load_manifest(data_dir, "sudoku"), "val").records


def _grid(cells, blank="."):
    return "".join(str(v) if v else blank for v in cells)


@pytest.mark.parametrize("form", ["lines", "zeros with solutions", "sudoku-extreme csv", "kaggle csv"])
def test_eval_on_a_puzzle_file_in_each_common_form_equals_eval_on_the_same_puzzles_split(run, tool, tmp_path, form):
    """The held-out split's own puzzles written as a file: the metrics are the split's (the solver finds the stored
    solution where the file gives none: each puzzle has one)."""
    data_dir, out = run
    records = _val_records(data_dir)
    lines = {
        "lines": ["# the held-out puzzles, no solutions"] + [_grid(p) for p, _ in records],
        "zeros with solutions": [f"{_grid(p, '0')},{_grid(s)}" for p, s in records],
        "sudoku-extreme csv": ["source,question,answer,rating"] + [f"gen,{_grid(p)},{_grid(s)},3" for p, s in records],
        "kaggle csv": ["quizzes,solutions"] + [f"{_grid(p, '0')},{_grid(s)}" for p, s in records],
    }[form]
    path = tmp_path / "puzzles.txt"
    path.write_text("\n".join(lines) + "\n")
    split = json.loads(tool("eval", str(out), "--json").stdout)
    res = tool("eval", str(out), "--puzzles", str(path), "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["puzzles"] == str(path) and got["examples"] == len(records) == split["examples"]
    for key in ("exact_accuracy", "cell_acc", "exact_accuracy_qhalt", "exact_by_segments", "ci95"):
        assert got[key] == split[key], key
    assert got["val_loss"] == pytest.approx(split["val_loss"], rel=1e-6)


def test_eval_puzzle_file_bad_input_is_one_line(run, tool, tmp_path):
    data_dir, out = run
    (p, s), = _val_records(data_dir)[:1]
    two = list(s)
    two[:9] = [0] * 9  # a row of blanks only: its digits are still forced, one solution
    empty = [0] * 81  # every grid solves it
    cases = {
        "1" * 80: "line 1: not a puzzle: expected 81 characters",
        f"{_grid(p)}\n{_grid(empty)}": "line 2: the puzzle has more than one solution: give the one to score",
        f"{_grid(two)}\n{'1' * 81}": "line 2: the puzzle has no solution",
        f"{_grid(p)},{_grid(s)[::-1]}": "line 1: the answer does not keep the question's givens",
        "# only a comment": "no puzzle in it",
    }
    for text, expected in cases.items():
        path = tmp_path / "bad.txt"
        path.write_text(text + "\n")
        res = tool("eval", str(out), "--puzzles", str(path))
        assert res.returncode == 2 and res.stdout == "", (text, res.stdout)
        assert res.stderr.startswith(f"error: {path}") and expected in res.stderr, (expected, res.stderr)
        assert len(res.stderr.splitlines()) == 1
    res = tool("eval", str(out), "--puzzles", str(path), "--data", str(data_dir))
    assert res.returncode == 2 and "--puzzles FILE and --data DIR each say what to evaluate on" in res.stderr
    res = tool("eval", str(out), "--puzzles", str(tmp_path / "none.txt"))
    assert res.returncode == 2 and "none.txt: cannot read it (No such file or directory)" in res.stderr


@pytest.mark.parametrize("args, expected", [
    (["nowhere"], "nowhere: no such checkpoint or run directory"),
    (["{data}"], "no whole checkpoint-<step> directory there"),
    (["{out}", "--split", "test"], "--split test: "),
    (["{out}", "--batches", "0"], "Invalid value for '--batches': 0 is not in the range x>=1"),
    (["{out}", "--segments", "0"], "Invalid value for '--segments': 0 is not in the range x>=1"),
    (["{out}", "--batch-size", "0"], "Invalid value for '--batch-size': 0 is not in the range x>=1"),
    ([], "Missing argument 'CHECKPOINT'"),
])
def test_eval_bad_input_is_one_line_and_exit_2(run, tool, args, expected):
    data, out = run
    res = tool("eval", *[a.format(data=data, out=out) for a in args])
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: ") and expected in res.stderr and len(res.stderr.splitlines()) == 1


def test_solve_prints_a_grid_per_puzzle_its_validity_and_a_summary(run, tool):
    base, out = run
    puzzle = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
    res = tool("solve", str(out), "-", stdin=f"# a comment\n{puzzle}\n\n{puzzle.replace('.', '0')}\n")
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and lines[-1].startswith(("0 of 2 solved", "1 of 2 solved", "2 of 2 solved"))
    for line in lines[:2]:
        grid, verdict = line.split()
        assert len(grid) == 81 and set(grid) <= set("123456789") and verdict in ("valid", "INVALID")
    assert res.returncode == (0 if lines[-1].startswith("2 of 2") else 1)
    js = tool("solve", str(out), "--json", stdin=puzzle + "\n")
    assert json.loads(js.stdout.splitlines()[0])["puzzle"] == puzzle


def test_a_solution_must_keep_the_givens_and_be_a_valid_grid():
    from auralm.tools.solve import is_solution

    solution = [int(c) for c in "534678912672195348198342567859761423426853791713924856961537284287419635345286179"]
    puzzle = [v if i % 3 else 0 for i, v in enumerate(solution)]
    assert is_solution(solution, puzzle)
    swapped = solution[:]
    swapped[0], swapped[1] = swapped[1], swapped[0]
    assert not is_solution(swapped, [0] * 81)  # rows fine, columns broken
    other = [10 - v for v in solution]  # a valid grid, but not these givens
    assert is_solution(other, [0] * 81) and not is_solution(other, puzzle)


@pytest.mark.parametrize("stdin, expected", [
    ("12345\n", "standard input line 1: '12345' is not a puzzle: expected 81 characters"),
    ("." * 81 + "\n" + "x" * 81 + "\n", "standard input line 2:"),
    ("\n# nothing\n", "no puzzle in it"),
])
def test_solve_names_the_line_that_is_not_a_puzzle(run, tool, stdin, expected):
    res = tool("solve", str(run[1]), stdin=stdin)
    assert res.returncode == 2 and res.stdout == "" and expected in res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_solve_refuses_a_checkpoint_that_is_not_a_sudoku_model(tmp_path, tool, quijote_data):
    data_dir = quijote_data(300, 20000)  # the session's text data (read only: the run writes under tmp_path)
    train.run(parse(["task=lm", f"data_dir={data_dir}", f"out_dir={tmp_path / 'lm'}", "model=tiny",
                     "training.max_steps=1", "training.eval_interval=0", "training.sample_tokens=0"]))
    res = tool("solve", str(tmp_path / "lm"), stdin="." * 81 + "\n")
    assert res.returncode == 2 and "is a task=lm model, not a sudoku model" in res.stderr
    missing = tool("solve", str(tmp_path / "lm"), str(tmp_path / "none.txt"))
    assert missing.returncode == 2


def test_hrmctl_eval_and_solve_run_the_trainers_tools(run):
    """The same tools through hrmctl's own process: Typer's help, hrmctl's one-line errors."""
    base, out = run
    res = cli("cli", "eval", str(out), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["checkpoint"].endswith("checkpoint-4")
    res = cli("cli", "solve", str(out), "-", stdin="1" * 80 + "\n")
    assert res.returncode == 2 and res.stderr.startswith("error: standard input line 1:")
    res = cli("cli", "eval", "--help")
    assert res.returncode == 0 and "Usage: hrmctl eval [OPTIONS] {CHECKPOINT}" in res.stdout and "usage:" not in res.stdout


@pytest.mark.parametrize("overrides, parameters, text", [(["model=hrm-27m"], "27.2", False),
                                                         (["model=trm-tiny"], "0.43", True),
                                                         (["arch=trm", "model=trm-5m-mlp"], "4.86", False)])
def test_train_dry_run_prints_the_models_parameters_and_memory_per_rank(tmp_path, overrides, parameters, text):
    """One --json dry run per model (the size the text line is printed from); the text line itself once, for the
    smallest model: it is the same formatting whatever the model (before, every model ran both, six dry runs)."""
    res = cli("cli", "train", "--dry-run", "--json", *overrides, "global_batch_size=32", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    size = json.loads(res.stdout)["model"]
    assert f"{size['parameters'] / 1e6:.2f}".startswith(parameters) and size["batch_size"] == 32, size
    assert size["total_bytes"] == size["states_bytes"] + size["activation_bytes"] > 16 * size["parameters"]
    if text:
        res = cli("cli", "train", "--dry-run", *overrides, "global_batch_size=32", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        line = res.stdout.strip().splitlines()[-1]
        assert line.startswith("# model ") and f"{parameters}" in line and "GiB" in line, line
        assert "at batch 32 per rank" in line, line
    assert not (tmp_path / "runs").exists()
