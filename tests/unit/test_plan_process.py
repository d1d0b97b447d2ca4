"""The launch's one plan process (cli/launch/plan/planner.py asking auralm.planning.server): every question of a
launch answered by the same process, in the order asked, with the same documents the trainer's planning functions
give in this process; a question the trainer's parser refuses answered with its one line while the process goes on;
a process that ends fails what waits with its last line; close() ends it and the next question starts another."""

from __future__ import annotations

import os
import signal

import pytest

from auralm.planning import sizing
from cli.launch.plan import link_cache, memory, planner
from cli.launch.plan.options import LaunchOptions
from cli.nodes.inventory import Node

pytestmark = pytest.mark.slow  # two real processes importing torch

TIMEOUT_S = 180  # an import of torch and a model on the meta device, on a loaded 2-core machine: a bound on a hang


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("HRMCTL_CACHE", str(tmp_path / "cache"))  # no estimate cached from another test
    planner.close()
    yield
    planner.close()


def _pid() -> int:
    return planner._current.proc.pid


def test_one_process_answers_a_launchs_questions_in_order_and_a_refusal_does_not_end_it():
    args = ["model=trm-tiny", "training.batch_size=8"]
    first = planner.ask("size", TIMEOUT_S, args=args, world=1, vocab=None)
    pid = _pid()
    refused = planner.ask("size", TIMEOUT_S, args=["training.max_stepz=3"], world=1)
    bigger = planner.ask("size", TIMEOUT_S, args=[*args[:1], "training.batch_size=16"], world=1)
    assert first.result() == sizing.document(args, 1)  # the document the sizing function gives here
    assert refused.result() is None and "max_stepz" in refused.error and "\n" not in refused.error, refused.error
    assert bigger.result()["activation_bytes"] == 2 * first.result()["activation_bytes"]
    assert _pid() == pid  # one process for all three
    # the launcher's own reading of it: memory.model_size asks the same process
    opts = LaunchOptions(nodes=[Node(name="localhost", host="localhost", user="root")], args=args)
    assert memory.model_size(opts, 1) == first.result() and _pid() == pid
    planner.close()
    assert planner._current is None
    again = planner.ask("size", TIMEOUT_S, args=args, world=2)
    assert again.result()["parameters"] == first.result()["parameters"] and _pid() != pid  # another process


def test_a_process_that_ends_fails_what_waits_with_a_line_and_a_late_answer_is_said_late():
    late = link_cache.advise({"nodes": ["node0", "node1"]}, ["model=trm-tiny"], None, timeout_s=0.01)
    waiting = planner.ask("size", TIMEOUT_S, args=["model=trm-tiny"], world=1)
    assert late.result() is None and late.late  # its process still imports torch
    os.kill(_pid(), signal.SIGKILL)
    assert waiting.result() is None and not waiting.late
    assert waiting.error == f"the plan's process ended (exit code {-signal.SIGKILL})", waiting.error
    # the next question starts a process again
    assert planner.ask("size", TIMEOUT_S, args=["model=trm-tiny"], world=1).result()["name"] == "trm-tiny"
