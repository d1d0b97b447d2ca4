"""The Typer command line itself: --version, help, shell completion, usage errors, overrides after the options."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


def hrmctl(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_version_and_every_command_in_the_help():
    from cli import __version__

    res = hrmctl("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"hrmctl {__version__}"
    res = hrmctl("--help")
    assert res.returncode == 0
    for name in ("nodes", "doctor", "sync-data", "test-ddp", "train", "prepare-data", "eval", "solve", "generate",
                 "export", "validate-model", "--install-completion"):
        assert name in res.stdout, name


def test_no_command_shows_the_help_and_exit_2():
    res = hrmctl()
    assert res.returncode == 2 and "Commands" in res.stdout


@pytest.mark.parametrize("words, cword, expected", [("hrmctl sy", 1, "sync-data"),
                                                     ("hrmctl train --dr", 2, "--dry-run"),
                                                     ("hrmctl doctor --mas", 2, "--master-port"),
                                                     ("hrmctl prepare-data --vocab", 2, "--vocab-size"),
                                                     ("hrmctl prepare-data --task s", 3, "sudoku"),
                                                     ("hrmctl prepare-data --dataset-name x.txt --shard", 4,
                                                      "--shard-tokens"),
                                                     ("hrmctl eval runs/r1 --batch-s", 3, "--batch-size"),
                                                     ("hrmctl generate runs/r1 --max", 3, "--max-new-tokens"),
                                                     ("hrmctl valid", 1, "validate-model")])
def test_bash_completion_completes_commands_and_options(words, cword, expected):
    res = hrmctl(env={"_HRMCTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
    assert res.returncode == 0 and res.stdout.split() == [expected]


@pytest.mark.parametrize("args, expected", [
    (["sync-data", "node0", "--stall-timeout", "0"], "Invalid value for '--stall-timeout'"),
    (["train", "--nproc", "two"], "Invalid value for '--nproc'"),
    (["nodes", "--json", "--check", "--nope"], "No such option: --nope"),
    (["test-ddp", "--seconds", "-1"], "Invalid value for '--seconds'"),
    (["prepare-data", "--task", "nope"], "Invalid value for '--task': 'nope' is not one of 'lm', 'maze', 'sudoku'."),
    (["prepare-data", "--task", "sudoku", "--workers", "0"], "Invalid value for '--workers'"),
    (["eval", "runs/r1", "--batch-size", "0"], "Invalid value for '--batch-size': 0 is not in the range x>=1."),
    (["eval"], "Missing argument 'CHECKPOINT'."),
    (["solve", "runs/r1", "--nope"], "No such option: --nope"),
    (["generate", "runs/r1"], "Missing option '--prompt'."),
    (["generate", "runs/r1", "--prompt", "x", "--top-k", "-1"], "Invalid value for '--top-k'"),
    (["export", "runs/r1"], "Missing option '--out'."),
    (["validate-model", "--jsn"], "No such option: --jsn"),
])
def test_usage_errors_are_one_line_naming_the_commands_help(tmp_path, args, expected):
    res = hrmctl(*args, cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(f"error: {expected}") and res.stderr.count("\n") == 1
    assert f"(see `hrmctl {args[0]} --help`)" in res.stderr and "Traceback" not in res.stderr


TOOLS = ("prepare-data", "eval", "solve", "generate", "export", "validate-model")


@pytest.mark.parametrize("name", TOOLS)
def test_the_trainers_tools_have_typers_help_like_every_command(name):
    """Issue 64, item 11: the trainer's tools are Typer commands of hrmctl, not argparse behind a pass-through: the
    same help (usage line, panels), and showing it imports no torch (-X importtime: one line per module imported)."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "cli", name, "--help"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"Usage: hrmctl {name} [OPTIONS]" in res.stdout and "Options" in res.stdout, res.stdout
    assert "usage:" not in res.stdout and "show this help message" not in res.stdout  # argparse's words
    assert not re.search(r"\|\s+(torch|transformers|datasets)$", res.stderr, re.M)


def test_prepare_data_reads_the_guides_spellings_before_typer_parses_them(tmp_path):
    """A guide's option (AuraLM's --dataset-max-tokens) is read as ours before Typer checks the values, so Typer's
    check applies to it: one line, exit 2, nothing written."""
    res = hrmctl("prepare-data", "--dataset-name", "x.txt", "--dataset-max-tokens", "0", cwd=tmp_path)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == ("error: Invalid value for '--max-tokens': 0 is not in the range x>=1. (see `hrmctl "
                          "prepare-data --help`)\n")
    res = hrmctl("prepare-data", "--shard_tokens", "5", cwd=tmp_path)
    assert res.stderr == "error: unknown option --shard_tokens (did you mean --shard-tokens?)\n"
    assert not (tmp_path / "data").exists()


@pytest.mark.slow  # seconds of real work (a training, hrmctl train, a compile): not in --fast (issue 35, item 6)
def test_trainer_overrides_pass_through_around_the_options(tmp_path):
    """key=value before and after hrmctl's own options reach the trainer, in order; an unknown option is refused."""
    res = hrmctl("train", "model=tiny", "--dry-run", "training.max_steps=3", "--run-id", "r1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "-m auralm.training.train model=tiny training.max_steps=3 " in res.stdout and "out_dir=runs/r1" in res.stdout
    res = hrmctl("train", "model=tiny", "--dry-runn", cwd=tmp_path)
    assert res.returncode == 2 and "unknown option --dry-runn" in res.stderr
