"""The Typer command line itself: --version, help, shell completion, usage errors, overrides after the options."""

from __future__ import annotations

import os
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
    for name in ("nodes", "doctor", "sync-data", "test-ddp", "train", "prepare-data", "eval", "solve",
                 "--install-completion"):
        assert name in res.stdout, name


def test_no_command_shows_the_help_and_exit_2():
    res = hrmctl()
    assert res.returncode == 2 and "Commands" in res.stdout


@pytest.mark.parametrize("words, cword, expected", [("hrmctl sy", 1, "sync-data"),
                                                     ("hrmctl train --dr", 2, "--dry-run"),
                                                     ("hrmctl doctor --mas", 2, "--master-port")])
def test_bash_completion_completes_commands_and_options(words, cword, expected):
    res = hrmctl(env={"_HRMCTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)})
    assert res.returncode == 0 and res.stdout.split() == [expected]


@pytest.mark.parametrize("args, expected", [
    (["sync-data", "node0", "--stall-timeout", "0"], "Invalid value for '--stall-timeout'"),
    (["train", "--nproc", "two"], "Invalid value for '--nproc'"),
    (["nodes", "--json", "--check", "--nope"], "No such option: --nope"),
    (["test-ddp", "--seconds", "-1"], "Invalid value for '--seconds'"),
])
def test_usage_errors_are_one_line_naming_the_commands_help(tmp_path, args, expected):
    res = hrmctl(*args, cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith(f"error: {expected}") and res.stderr.count("\n") == 1
    assert f"(see `hrmctl {args[0]} --help`)" in res.stderr and "Traceback" not in res.stderr


def test_trainer_overrides_pass_through_around_the_options(tmp_path):
    """key=value before and after hrmctl's own options reach the trainer, in order; an unknown option is refused."""
    res = hrmctl("train", "model=tiny", "--dry-run", "training.max_steps=3", "--run-id", "r1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "-m auralm.training.train model=tiny training.max_steps=3 " in res.stdout and "out_dir=runs/r1" in res.stdout
    res = hrmctl("train", "model=tiny", "--dry-runn", cwd=tmp_path)
    assert res.returncode == 2 and "unknown option --dry-runn" in res.stderr
