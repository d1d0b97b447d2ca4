"""The trainer's own reason for a stop a restart cannot fix (auralm.errors.STOP_TAG), as the launcher takes it: the
run's reason, hrmctl's last line and status.json's, no restart; and hrmctl's exit when its reader goes before a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rich.console import Console

from auralm import errors
from cli.launch.plan.plan import NodeFacts
from cli.launch.run.attempt import RunResult, _failure, summary_line
from cli.launch.run.log import MergedLog
from cli.launch.supervise.status import ended
from cli.runs.catalog import load_run
from tests.unit.test_launch_plan import FakeJob, node, plan

GUARD = ("nan guard: stopping: all 20 steps 1-20 skipped on every rank (non-finite gradients on rank 1), and no "
         "update was applied in this run: rerun with training.dtype=fp32")


def report(rank: int, code: int) -> list[str]:
    """torchrun's failure report, as far as the launcher reads it."""
    return ["Root Cause (first observed failure):", "[0]:", f"  rank      : {rank} (local_rank: 0)",
            f"  exitcode  : {code} (pid: 11)"]


def two_nodes(tmp_path, console: Console):
    plans = plan(nodes=[node("a", "10.0.0.1"), node("b", "10.0.0.2")],
                 facts={"a": NodeFacts(cpus=2), "b": NodeFacts(cpus=2)})
    log = MergedLog(console, tmp_path, plans)
    log.start(plans, 1)
    return plans, log


def test_stop_prints_the_tagged_line_only_under_the_launcher(capsys, monkeypatch):
    monkeypatch.delenv(errors.LAUNCHER_ENV, raising=False)
    assert errors.stop("error: bad key", 0) == 2
    assert capsys.readouterr().err == "error: bad key\n"  # alone (python -m auralm.training.train): the line, nothing more
    monkeypatch.setenv(errors.LAUNCHER_ENV, "r1/a")
    errors.stop("error: rank 1: out of CPU memory: lower training.batch_size", 1)
    line, tagged = capsys.readouterr().err.splitlines()
    assert line.startswith("error: rank 1: out of CPU memory") and tagged.startswith(errors.STOP_TAG)
    assert json.loads(tagged[len(errors.STOP_TAG):]) == {
        "reason": "rank 1: out of CPU memory: lower training.batch_size", "rank": 1, "exit_code": 2}


def test_the_trainers_line_is_the_reason_and_no_restart_is_made(tmp_path):
    """rank 0 on a says why (a bad-input stop is said by rank 0 only); torchrun on b blames its rank 1, which exited
    2 with it: the reason is rank 0's line, not "rank 1 on b failed first"; the tag's line is in a's file only."""
    screen = open(tmp_path / "screen", "w")
    plans, log = two_nodes(tmp_path, Console(file=screen, width=300))
    log.line("a", 0, "error: " + GUARD)
    log.line("a", 0, errors.STOP_TAG + json.dumps({"reason": GUARD, "rank": 0, "exit_code": 2}))
    log.line("b", 1, "[rank1]:error: rank 1: Connection closed by peer")  # a worker's line: shown
    for line in ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", *report(1, 2)]:
        log.line("b", 1, line)  # torchrun's own (no rank prefix): b's file only, the trainer has said why
    res = _failure(plans, log, {"a": FakeJob(None), "b": FakeJob(1)}, {"b": 1}, "b")
    assert (res.reason, res.failed_node, res.failed_rank, res.code) == (GUARD, "a", 0, 1)
    assert res.from_trainer and "a restart would stop the same way" in res.no_restart
    res.seconds = 12.34
    assert summary_line(res) == GUARD + " (rank 0 on a, after 12.3s)"
    log.close()
    shown = (tmp_path / "screen").read_text()
    assert GUARD in shown and errors.STOP_TAG not in shown  # the human line on screen, the tag not
    assert "Connection closed by peer" in shown and "ChildFailedError" not in shown and "Root Cause" not in shown
    assert errors.STOP_TAG in (tmp_path / "a.log").read_text()
    assert "ChildFailedError" in (tmp_path / "b.log").read_text()


def test_exit_2_without_the_trainers_line_is_not_restarted_a_crash_is(tmp_path):
    plans, log = two_nodes(tmp_path, Console(file=open(os.devnull, "w")))
    for line in report(1, 2):
        log.line("b", 1, line)
    res = _failure(plans, log, {"a": FakeJob(None), "b": FakeJob(1)}, {"b": 1}, "b")
    assert res.reason == "rank 1 on b failed first (exit code 1, worker exit code 2)" and not res.from_trainer
    assert res.no_restart.startswith("the trainer stopped with exit code 2")
    log.start(plans, 2)  # the next attempt: what the last one said is forgotten
    for line in report(1, 1):
        log.line("b", 1, line)
    res = _failure(plans, log, {"a": FakeJob(None), "b": FakeJob(1)}, {"b": 1}, "b")
    assert res.no_restart == "" and "worker exit code" not in res.reason  # a crash: restarted
    log.close()


def test_status_json_and_runs_give_the_trainers_line(tmp_path):
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    doc = {"run_id": "r1", "state": "running", "started": 1.0, "nodes": ["a"]}
    res = RunResult(1, GUARD, failed_node="a", failed_rank=0, from_trainer=True, no_restart="a restart would not")
    ended(run_dir, dict(doc), res, 1, None)
    saved = json.loads((run_dir / "status.json").read_text())
    assert (saved["state"], saved["reason"], saved["no_restart"]) == ("failed", GUARD, "a restart would not")
    run = load_run(run_dir)
    assert (run.status, run.reason, run.to_dict()["no_restart"]) == ("failed", GUARD, "a restart would not")
    ended(run_dir, dict(doc), RunResult(143, "stopped by SIGTERM", interrupted=True), 1, None)
    assert "no_restart" not in json.loads((run_dir / "status.json").read_text())


def test_a_reader_gone_before_the_run_is_exit_141_quietly(tmp_path):
    """`hrmctl --help | head -1`, its reader gone before hrmctl writes: 141 and nothing on stderr (click alone: 1)."""
    for args in (["--help"], ["train", "--help"]):
        proc = subprocess.Popen([sys.executable, "-m", "cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=tmp_path, env=dict(os.environ, COLUMNS="80"))
        proc.stdout.close()  # the reader gone
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141, err
        assert err == b""


class OomKillerStruck:
    """The node's OOM-kill count grew (cli.launch.run.oom.OomCounts): a stand-in here; the real count, grown by the
    kernel's OOM killer in a capped memory cgroup, is tests/cluster/test_memory_cap.py's."""

    def grew(self, name: str) -> bool:
        return True


def test_a_rank_the_oom_killer_took_is_not_restarted_another_signal_is(tmp_path):
    plans, log = two_nodes(tmp_path, Console(file=open(os.devnull, "w")))
    for line in report(1, -9):
        log.line("b", 1, line)
    res = _failure(plans, log, {"a": FakeJob(None), "b": FakeJob(1)}, {"b": 1}, "b", OomKillerStruck())
    assert "b ran out of memory" in res.reason and res.no_restart == "the same run would run out of memory again"
    log.start(plans, 2)
    for line in report(1, -11):
        log.line("b", 1, line)
    res = _failure(plans, log, {"a": FakeJob(None), "b": FakeJob(1)}, {"b": 1}, "b", OomKillerStruck())
    assert res.reason == "rank 1 on b was killed by SIGSEGV" and res.no_restart == ""  # a crash: restarted
    log.close()
