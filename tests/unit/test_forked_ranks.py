"""lab/forked_ranks.py (the suite's start-up) with real torchrun: in the suite's processes (lab.SITE_DIR on their
PYTHONPATH) on this machine (a CPU build of torch) the ranks are forked from node/torchrun.py's agent, which
has torch imported, and see what a new interpreter would give them: their own session, torchrun's environment for
them (and torch's threads set from it), no file of the agent's, the default signal handlers, their own command line
and exit handlers, unbuffered output; their ends (an exit code, a message, an exception, an interrupt) reach torchrun
as a new interpreter's would. HRMCTL_FORK_RANKS=0 starts them as torchrun does, and so does the product alone (no
lab on the path): it never patches torch. The ranks here are tests/rank_probe.py."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.trainer.helpers import PYTHON, REPO, python_env

MODULE = "tests.rank_probe"


def _launch(out, end: str, product_alone: bool = False, **env) -> tuple[subprocess.Popen, str, str]:
    """Two ranks of the probe under node/torchrun.py; OMP_NUM_THREADS left for torchrun to set.
    ``product_alone``: the checkout on PYTHONPATH and nothing of the lab's, as a user runs it."""
    cmd = [PYTHON, "-m", "node", "torchrun", "--", "--standalone", "--nproc_per_node", "2", "--tee", "3",
           "-m", MODULE, str(out), end]
    base = python_env(**env)
    base.pop("OMP_NUM_THREADS")
    if product_alone:
        base["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(cmd, cwd=REPO, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=120)
    return proc, stdout, stderr


def _reports(out) -> list[dict]:
    return [json.loads((out / f"{rank}.json").read_text()) for rank in ("0", "1")]


def test_ranks_are_forked_from_the_agent_and_see_what_a_new_interpreter_would(tmp_path):
    proc, out, err = _launch(tmp_path, "ok")
    assert proc.returncode == 0, err[-3000:]
    ranks = _reports(tmp_path)
    for i, r in enumerate(ranks):
        assert r["forked"], r  # torch was imported before the rank's first line: the agent's
        assert r["ppid"] == proc.pid and r["sid"] == r["pid"], r  # the agent's child, in a session of its own
        assert (r["rank"], r["local_rank"], r["world"]) == (str(i), str(i), "2")
        assert r["omp"] == "1" and r["threads"] == 1, r  # torchrun's OMP_NUM_THREADS for two ranks, applied
        assert r["cmdline"] == [PYTHON, "-u", "-m", MODULE, str(tmp_path), "ok"], r["cmdline"]
        assert r["argv"][1:] == [str(tmp_path), "ok"] and r["argv"][0].endswith("rank_probe.py")
        assert r["main"] == "__main__" and r["sigterm_default"], r  # not torchrun's handler
        assert r["sigpipe_ignored"], r  # as Python's start-up leaves it: a closed pipe raises, it does not kill
        assert r["log_streams"] and r["log_streams_ours"], r  # torch's log handlers write to the rank's streams
        assert set(r["files"]) <= {os.devnull}, r["files"]  # the agent's store socket and logs are not the rank's
        assert (tmp_path / f"{i}.atexit").read_text() == "ran"
        assert f"[default{i}]:rank {i} says hello" in out
    assert ranks[0]["pid"] != ranks[1]["pid"]


@pytest.mark.parametrize("how", [{"HRMCTL_FORK_RANKS": "0"}, {"product_alone": True}], ids=["off", "product-alone"])
def test_turned_off_or_without_the_lab_the_ranks_are_new_interpreters(tmp_path, how):
    proc, out, err = _launch(tmp_path, "ok", **how)
    assert proc.returncode == 0, err[-3000:]
    for r in _reports(tmp_path):
        assert not r["forked"] and r["ppid"] == proc.pid and r["threads"] == 1, r
        assert r["cmdline"] == [PYTHON, "-u", "-m", MODULE, str(tmp_path), "ok"]


@pytest.mark.parametrize("end, exitcode, said", [
    ("exit3", "3", None),
    ("message", "1", "rank gave up: a message"),
    ("raise", "1", "RuntimeError: the rank's own error"),
    ("interrupt", "-2", "KeyboardInterrupt"),
])
def test_a_forked_ranks_end_reaches_torchrun_as_a_new_interpreters_would(tmp_path, end, exitcode, said):
    proc, out, err = _launch(tmp_path, end)
    assert proc.returncode != 0
    assert f"exitcode  : {exitcode} " in err, err[-3000:]
    if said:
        assert said in out + err, (out + err)[-3000:]
    assert all(r["forked"] for r in _reports(tmp_path))


def test_a_node_whose_torch_sees_a_gpu_starts_its_ranks_as_torchrun_does(monkeypatch):
    """CUDA cannot be used in a child forked after it started: where torch sees a device (mocked here: this machine
    has none), no fork; none either when turned off, and nothing but ``python -u -m MODULE`` is forked."""
    import sys

    import torch

    from lab import forked_ranks

    monkeypatch.delenv("HRMCTL_FORK_RANKS", raising=False)
    assert forked_ranks.can_fork()  # a CPU build: forked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not forked_ranks.can_fork()
    monkeypatch.undo()
    monkeypatch.setenv("HRMCTL_FORK_RANKS", "0")
    assert not forked_ranks.can_fork()
    rank = (sys.executable, "-u", "-m", "auralm.training.train", "x=1")
    assert forked_ranks._module_of(rank) == "auralm.training.train"
    for other in [(sys.executable, "-u", "train.py"), ("/bin/echo", "-u", "-m", "x"),
                  ("numactl", "--cpunodebind=0", sys.executable, "-u", "-m", "x")]:
        assert forked_ranks._module_of(other) is None, other
