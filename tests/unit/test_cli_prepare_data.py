"""`hrmctl prepare-data` forwards to the trainer's data tool, as a process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def hrmctl(*args, cwd):
    return subprocess.run([sys.executable, "-m", "cli", "prepare-data", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_sudoku_data_through_the_cli(tmp_path):
    res = hrmctl("--task", "sudoku", "--out", "sdk", "--count", "60", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    meta_path = tmp_path / "sdk" / "meta.json"
    meta = json.loads(meta_path.read_text())
    assert meta["task"] == "sudoku"
    before = meta_path.stat().st_mtime_ns
    again = hrmctl("--task", "sudoku", "--out", "sdk", "--count", "60", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert meta_path.stat().st_mtime_ns == before  # same input, same options: nothing rewritten

def test_bad_input_is_one_line(tmp_path):
    res = hrmctl(str(tmp_path / "missing.txt"), "--out", "x", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and "missing.txt" in res.stderr
    assert not (tmp_path / "x").exists()
    res = hrmctl("--task", "sudoku", cwd=tmp_path)
    assert res.returncode == 2 and "--out" in res.stderr and "Traceback" not in res.stderr
