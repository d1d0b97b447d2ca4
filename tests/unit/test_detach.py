"""`train --detach`'s supervisor line, and `attach`/`stop` of a run that is not running (the running cases, over real
SSH to lab nodes: tests/cluster/test_detach.py)."""

from __future__ import annotations

import io
import json
import sys

from cli.app import main
from cli.launch.supervise.detach import supervisor_argv
from cli.runs.control import attach, stop


def test_the_supervisor_gets_the_same_arguments_without_detach_with_the_run_id():
    argv = supervisor_argv(["train", "--detach", "--nodes", "a,b", "model=tiny"], "r1")
    assert argv == [sys.executable, "-m", "cli", "train", "--nodes", "a,b", "model=tiny", "--run-id", "r1",
                    "--supervisor"]
    given = supervisor_argv(["train", "--run-id", "mine", "--detach"], "mine")
    assert given[3:] == ["train", "--run-id", "mine", "--supervisor"]


def test_detach_with_dry_run_is_refused(capsys):
    assert main(["train", "--detach", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip() == ("error: --detach with --dry-run: a dry run starts nothing to detach; "
                                               "drop one of them")


def test_attach_and_stop_of_an_ended_run_say_so_with_its_exit_code(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "node0.log").write_text("10:00:00.000 [rank0]:step 1/2\n10:00:01.000 [rank0]:step 2/2\n")
    (run / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 1, "reason": "rank 1 failed",
                                                 "started": 1.0, "ended": 2.0, "detached": True}))
    (run / "supervisor.err").write_text("hrmctl: run r1: supervisor started\nerror: rank 1 failed after 1.0s\n")
    out, err = io.StringIO(), io.StringIO()
    assert attach(run, out=out, err=err, last=1) == 1
    assert out.getvalue() == "10:00:01.000 [rank0]:step 2/2\n"
    assert err.getvalue().strip() == "hrmctl: run r1 is not running; error: rank 1 failed after 1.0s"
    err = io.StringIO()
    assert stop(run, err=err) == 0
    assert err.getvalue().strip() == "hrmctl: run r1 is not running (failed: rank 1 failed); nothing to stop"


def test_a_supervisor_that_ends_before_its_first_step_gives_its_reason_and_leaves_no_run(tmp_path, monkeypatch,
                                                                                          capsys):
    """A real supervisor (a second hrmctl, in a session of its own) refusing a bad override: its line, its code."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--detach", "training.max_stepz=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: trainer overrides rejected: unknown key 'training.max_stepz'"), err
    assert list((tmp_path / "runs").iterdir()) == []
