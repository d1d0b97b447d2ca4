"""`hrmctl eval` and `hrmctl solve` (auralm.tools.evaluate, auralm.tools.solve) on a checkpoint of a real short HRM run."""

from __future__ import annotations

import json
import subprocess

import pytest

from auralm.training import train
from auralm.training.config import parse
from tests.trainer.helpers import PYTHON, REPO, python_env, small_sudoku

# a real HRM run, then a Python process per test (eval, solve, hrmctl train --dry-run): 70 s of CPU measured,
# the largest module of the unit tier; the whole suite runs it, scripts/test.sh --fast does not
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("hrm")
    data_dir = small_sudoku(base / "data", count=300)
    out = base / "run"
    train.run(parse([f"data_dir={data_dir}", f"out_dir={out}", "model=hrm-tiny", "model.n_embd=32",
                     "model.halt_max_steps=3", "model.eval_segments=3", "training.batch_size=16", "training.max_steps=4",
                     "training.eval_interval=0", "training.ema=true"]))
    return base, out


def cli(module: str, *args: str, stdin: str | None = None, cwd=None):
    return subprocess.run([PYTHON, "-m", module, *args], capture_output=True, text=True, input=stdin, timeout=120,
                          env=python_env(), cwd=cwd or REPO)


def test_eval_reports_exact_and_cell_accuracy_halting_and_accuracy_by_segments(run):
    base, out = run
    res = cli("auralm.tools.evaluate", str(out), "--json")
    assert res.returncode == 0, res.stderr
    r = json.loads(res.stdout)
    assert r["checkpoint"].endswith("checkpoint-4") and r["split"] == "val" and r["examples"] == 30
    assert 0 <= r["exact_accuracy"] <= 1 and 0 < r["cell_acc"] <= 1
    assert len(r["exact_by_segments"]) == 3 and r["exact_by_segments"][-1] == r["exact_accuracy"]
    assert 1 <= r["halt_steps"] <= 3


@pytest.mark.parametrize("args, expected", [
    (["nowhere"], "nowhere: no such checkpoint or run directory"),
    (["{data}"], "no whole checkpoint-<step> directory there"),
    (["{out}", "--split", "test"], "--split test: "),
    (["{out}", "--batches", "0"], "must be greater than 0"),
    (["{out}", "--segments", "0"], "must be greater than 0"),
])
def test_eval_bad_input_is_one_line_and_exit_2(run, args, expected):
    base, out = run
    res = cli("auralm.tools.evaluate", *[a.format(data=base / "data", out=out) for a in args])
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error: ") and expected in res.stderr and len(res.stderr.splitlines()) == 1


def test_solve_prints_a_grid_per_puzzle_its_validity_and_a_summary(run):
    base, out = run
    puzzle = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
    res = cli("auralm.tools.solve", str(out), "-", stdin=f"# a comment\n{puzzle}\n\n{puzzle.replace('.', '0')}\n")
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and lines[-1].startswith(("0 of 2 solved", "1 of 2 solved", "2 of 2 solved"))
    for line in lines[:2]:
        grid, verdict = line.split()
        assert len(grid) == 81 and set(grid) <= set("123456789") and verdict in ("valid", "INVALID")
    assert res.returncode == (0 if lines[-1].startswith("2 of 2") else 1)
    js = cli("auralm.tools.solve", str(out), "--json", stdin=puzzle + "\n")
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
def test_solve_names_the_line_that_is_not_a_puzzle(run, stdin, expected):
    res = cli("auralm.tools.solve", str(run[1]), stdin=stdin)
    assert res.returncode == 2 and res.stdout == "" and expected in res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_solve_refuses_a_checkpoint_that_is_not_a_sudoku_model(tmp_path):
    from auralm.data import datadir
    from tests.trainer.helpers import QUIJOTE

    data_dir = tmp_path / "text"
    assert datadir.main([str(QUIJOTE), "--out", str(data_dir), "--vocab-size", "300", "--max-tokens", "20000"]) == 0
    train.run(parse(["task=lm", f"data_dir={data_dir}", f"out_dir={tmp_path / 'lm'}", "model=tiny",
                     "training.max_steps=1", "training.eval_interval=0", "training.sample_tokens=0"]))
    res = cli("auralm.tools.solve", str(tmp_path / "lm"), stdin="." * 81 + "\n")
    assert res.returncode == 2 and "is a task=lm model, not a sudoku model" in res.stderr
    missing = cli("auralm.tools.solve", str(tmp_path / "lm"), str(tmp_path / "none.txt"))
    assert missing.returncode == 2


def test_hrmctl_eval_and_solve_run_the_trainers_tools(run):
    """The same tools through the hrmctl command line: its options and errors are the tool's, under hrmctl's name."""
    base, out = run
    res = cli("cli", "eval", str(out), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["checkpoint"].endswith("checkpoint-4")
    res = cli("cli", "solve", str(out), "-", stdin="1" * 80 + "\n")
    assert res.returncode == 2 and res.stderr.startswith("error: standard input line 1:")
    res = cli("cli", "eval", "--help")
    assert res.returncode == 0 and res.stdout.startswith("usage: hrmctl eval")


@pytest.mark.parametrize("overrides, parameters", [(["model=hrm-27m"], "27.2"), (["model=trm-tiny"], "0.43"),
                                                   (["arch=trm", "model=trm-5m-mlp"], "4.86M")])
def test_train_dry_run_prints_the_models_parameters_and_memory_per_rank(tmp_path, overrides, parameters):
    res = cli("cli", "train", "--dry-run", *overrides, "global_batch_size=32", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith("# model ") and f"{parameters}" in line and "GiB" in line and "at batch 32 per rank" in line
    res = cli("cli", "train", "--dry-run", "--json", *overrides, cwd=tmp_path)
    size = json.loads(res.stdout)["model"]
    assert size["total_bytes"] == size["states_bytes"] + size["activation_bytes"] > 16 * size["parameters"]
    assert not (tmp_path / "runs").exists()
