"""`hrmctl prepare-data`: a Typer command of hrmctl (cli/tools/prepare_data.py) that runs the trainer's preparer
(the task's prepare, auralm.tasks); the guides' spellings of its options read as ours before they are parsed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    res = hrmctl("--task", "sudoku", "--workers", "0", cwd=tmp_path)  # no --out: data/sudoku, as train reads it
    assert res.returncode == 2 and res.stderr == ("error: Invalid value for '--workers': 0 is not in the range x>=1. "
                                                  "(see `hrmctl prepare-data --help`)\n")


@pytest.mark.parametrize("args, line", [
    (["--task", "sudok"], "error: Invalid value for '--task': 'sudok' is not one of 'lm', 'maze', 'sudoku'. (see `hrmctl "
                          "prepare-data --help`)"),
    (["--max-tokens", "many", "x.txt"], "error: Invalid value for '--max-tokens': 'many' is not a valid int range. (see "
                                        "`hrmctl prepare-data --help`)"),
    (["a.txt", "b.txt"], "error: unexpected argument 'b.txt': prepare-data takes one SOURCE (a file, a directory of "
                         "them, or a dataset name, here 'a.txt'); quote a path with spaces"),
    (["--max_tokens", "5", "x.txt"], "error: unknown option --max_tokens (did you mean --max-tokens?)"),
    (["--datset-name", "x"], "error: unknown option --datset-name (did you mean --dataset-name? AuraLM's "
                             "train_gpt2_spanish.py's spelling of SOURCE)"),
    (["--batch_size", "8"], "error: unknown option --batch_size (the HRM distributed launcher's --batch_size is "
                            "training.batch_size of hrmctl train, not of hrmctl prepare-data)"),
    (["--dataset-max-tokens"], "error: --dataset-max-tokens needs a value (AuraLM's train_gpt2_spanish.py's spelling "
                               "of --max-tokens)"),
    (["--dataset-max-tokens", "500000"], "error: missing SOURCE: give a .txt/.jsonl/.parquet file, a directory of "
                                         "them, or a dataset name in the Hugging Face cache (`hrmctl prepare-data "
                                         "corpus.txt`), or --task sudoku for generated puzzles"),
    (["--prepare", "--dataset-name", "missing.txt", "--dataset-max-tokens", "0"],
     "error: Invalid value for '--max-tokens': 0 is not in the range x>=1. (see `hrmctl prepare-data --help`)"),
    (["--out"], "error: Option '--out' requires an argument."),
    (["--nope"], "error: unknown option --nope; `hrmctl prepare-data --help` lists the options"),
])
def test_every_bad_input_is_one_line_in_hrmctls_style(tmp_path, args, line):
    """Issue 63, item 6, and issue 64, item 11: no usage block, no traceback: `error: ` what is wrong and what to do,
    exit code 2, as every hrmctl command says a usage error (Typer's words for a value it checks)."""
    res = hrmctl(*args, cwd=tmp_path)
    assert (res.returncode, res.stdout, res.stderr) == (2, "", line + "\n"), res
    assert not (tmp_path / "data").exists()


def test_the_guides_options_are_read_as_ours(monkeypatch, capsys):
    from auralm import tasks
    from cli.app import main
    from cli.tools.prepare_data import read_guides

    assert read_guides(["--prepare", "--dataset-name", "wikipedia", "--dataset-max-tokens=500000"]) == (
        ["wikipedia", "--max-tokens", "500000"],
        ["--prepare is accepted (what hrmctl prepare-data does: hrmctl train refuses it with the prepare-data line to "
         "run first)", "--dataset-name wikipedia is wikipedia", "--dataset-max-tokens 500000 is --max-tokens 500000"])
    args, said = read_guides(["--output-dir", "data/sudoku-extreme-1k-aug-1000", "--subsample-size", "1000",
                             "--num-aug", "1000"])  # the HRM guide's build_sudoku_dataset.py line
    assert args == ["--out", "data/sudoku-extreme-1k-aug-1000", "--train", "1000", "--aug", "1000", "--task", "sudoku"]
    assert read_guides(["--task", "sudoku", "--num-aug", "3"])[0] == ["--task", "sudoku", "--aug", "3"]
    assert read_guides(["--dataset_name", "x.txt"])[0] == ["x.txt"]  # other dashes: the same option
    got = {}
    text = tasks.get("lm")
    monkeypatch.setattr(type(text), "prepare", lambda self, source, out, options: got.update(
        source=source, out=out, task=self.name, **options) or "prepared")
    assert main(["prepare-data", "--dataset-name", "es.txt", "--dataset-max-tokens", "500"]) == 0
    assert (got["source"], got["max_tokens"], got["out"], got["task"]) == ("es.txt", 500, Path("data/lm"), "lm")
    said = capsys.readouterr()
    assert said.out == "prepared\n" and said.err.splitlines() == [
        "hrmctl: read as ours: --dataset-name es.txt is es.txt; --dataset-max-tokens 500 is --max-tokens 500",
        "out: data/lm (no --out: the data directory hrmctl train reads for task=lm)"]


@pytest.mark.slow  # a tokenizer trained and a text tokenized: seconds of real work
def test_auralms_dataset_options_prepare_a_local_text_into_data_lm(tmp_path):
    from tests.trainer.helpers import QUIJOTE

    (tmp_path / "es.txt").write_text(QUIJOTE.read_text(encoding="utf-8-sig")[20000:50000], encoding="utf-8")
    res = hrmctl("--dataset-name", "es.txt", "--dataset-max-tokens", "2000", "--vocab-size", "300", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        "hrmctl: read as ours: --dataset-name es.txt is es.txt; --dataset-max-tokens 2000 is --max-tokens 2000",
        "out: data/lm (no --out: the data directory hrmctl train reads for task=lm)"]
    meta = json.loads((tmp_path / "data" / "lm" / "meta.json").read_text())
    assert meta["task"] == "lm" and sum(s["tokens"] for s in meta["splits"].values()) <= 2000
