"""A node that sleeps, is killed or is cut off during a real DiLoCo run (training.sync=diloco, whose default
training.elastic.min_nodes is 1: cli/launch/supervise/elastic.py, auralm/training/members.py): the ranks present find it
silent at the round's all-reduce and go on in the launch they are in, not restarted; it rejoins once it answers.
Each of issue 36's faults in turn, on two nodes and on three. The same faults under DDP: tests/cluster/test_elastic.py
(scripts/test.sh runs each test of both files beside the first phase, on a lab of its own)."""

from __future__ import annotations

import json
import re
import time

import pytest

from lab.nodes import sh
from tests.cluster.test_elastic import (ASLEEP_S, LEAN_ARGS, LINK_DOWN_S, PACE, _finish, _nothing_left, _records,
                                        _text, cut_off)
from tests.cluster.test_launch import start_hrmctl
from tests.polling import wait_for

# the whole suite runs this file beside the tests outside the cluster tier (scripts/test.sh): slower than alone
pytestmark = pytest.mark.timeout(1500)


def _final_val_loss(run_dir) -> float:
    return [r["val_loss"] for r in _records(run_dir) if "val_loss" in r][-1]


ALONE = re.compile(r"rank\(s\) (?:1, )?2 left the run")  # node0's rank, once rank 2 is gone too (rank 1's
# leave may still be in the making when rank 2 falls silent: then both in one line)
LEFT = "rank(s) 1 left the run"  # node0's rank, when it finds node1's rank gone (auralm/training/members.py)


def _events(run) -> list[tuple[str, str]]:
    """The run's leaves and joins so far (status.json's members): (node, event)."""
    doc = json.loads((run / "status.json").read_text()) if (run / "status.json").exists() else {}
    return [(e["node"], e["event"]) for e in doc.get("members", [])]


def test_diloco_goes_on_while_a_node_sleeps_is_killed_or_cut_off_and_ends_near_an_uninterrupted_run(lab3, tmp_path,
                                                                                                  book_on_nodes):
    """training.sync=diloco, whose default lets the run go on with one node: node1 asleep for ASLEEP_S (every process
    of its namespace stopped) right after a checkpoint. It is named within 30 s; node0's rank finds it silent at the
    round's all-reduce and finishes the round alone, not restarted (its launch goes on: no new launch, step lines
    keep coming); node1 rejoins when it wakes (both resume from a checkpoint saved at an agreed step). Then every
    process of node1's user is killed: left again, node0's rank finishes its round without it in the same launch,
    and node1, which answers at once, is back after that round. Then node1's link is cut for LINK_DOWN_S: named
    within 30 s, node0's rank goes on in the same launch, node1 is back once its link is. The run ends at max_steps
    with exit 0, nothing left. Its final validation loss is within 1% of the same run's left alone, at equal tokens
    (node0 alone takes two micro-batches a step), as issue 36 asks. The task is GPT tiny on Don Quijote, whose loss
    falls smoothly: the tiny sudoku model learns in sudden drops, and two runs of it that differ only in how the
    rows are shared out land up to 50% apart (bench/diloco_leave.py --task sudoku, docs/elastic.md)."""
    steps, every = 600, 20
    args = ["task=lm", f"data_dir={book_on_nodes}", "model=tiny", f"training.max_steps={steps}",
            "training.batch_size=8", "training.log_interval=10", f"training.checkpoint_interval={every}",
            "training.eval_interval=0", "training.eval_batches=32",
            "training.sync=diloco", "training.diloco.inner_steps=10", f"fault.step_sleep={PACE}", "logging.curves=false"]
    home = lab3.node("node0").home / "hrmctl" / "runs"
    # the reference waits for no fault and resumes from nothing: the pace changes the steps' times and a checkpoint
    # is only read back, neither changes what the steps compute
    unpaced = [a for a in args if not a.startswith(("fault.step_sleep=", "training.checkpoint_interval="))]
    unpaced.append("training.checkpoint_interval=0")
    ref = start_hrmctl(["train", "--nodes", "node0,node1", "--run-id", "dl-ref", *unpaced], lab3.inventory, tmp_path)
    out, err = ref.communicate(timeout=600)
    assert ref.returncode == 0, (out + err)[-3000:]

    victim = lab3.nodes[1]
    proc = start_hrmctl(["train", "--nodes", "node0,node1", "--run-id", "dl-sleep", *args], lab3.inventory, tmp_path)
    log0, status = tmp_path / "runs" / "dl-sleep" / "node0.log", tmp_path / "runs" / "dl-sleep" / "status.json"
    try:
        wait_for(lambda: f"saved runs/dl-sleep/checkpoint-{every}" in _text(log0) or proc.poll() is not None, 240,
                 "the first checkpoint", every=0.5)
        assert proc.poll() is None, proc.communicate()
        asleep = time.time()
        victim.freeze(True)
        try:
            wait_for(lambda: ("node1", "left") in _events(status.parent) or proc.poll() is not None, 60,
                     "node1 to be named as left", every=0.5)
            # the sleep lasts ASLEEP_S and until node0's rank has stepped without node1 (how soon depends on the
            # machine's speed, which no verdict here may: 240 s, three times what a fresh, loaded 2-core host took)
            wait_for(lambda: LEFT in _text(log0) and re.search(r"\[rank0\]:step \d+/", _text(log0).split(LEFT)[-1])
                     or proc.poll() is not None, 240, "node0's rank to go on without node1, and step", every=0.5)
            time.sleep(max(0.0, asleep + ASLEEP_S - time.time()))
            alone = _text(log0).split(LEFT)[-1]
        finally:
            victim.freeze(False)
        wait_for(lambda: _text(log0).count("resuming from") >= 1 and
                 re.search(r"\[rank0\]:step \d+/", _text(log0).split("resuming from")[-1]) or proc.poll() is not None,
                 240, "node1 back in the run", every=0.5)
        sh(["pkill", "-KILL", "-u", victim.user])
        wait_for(lambda: _text(log0).count(LEFT) >= 2 or proc.poll() is not None, 90,
                 "node0's rank to go on without the killed node1", every=0.5)
        before_kill_left = LEFT.join(_text(log0).split(LEFT)[:2])
        wait_for(lambda: _text(log0).count("resuming from") >= 2 and
                 re.search(r"\[rank0\]:step \d+/", _text(log0).split("resuming from")[-1]) or proc.poll() is not None,
                 240, "node1 back in the run after the kill", every=0.5)
        assert proc.poll() is None, proc.communicate()
        cut = time.time()
        try:
            cut_off(victim, True)
            wait_for(lambda: _text(log0).count(LEFT) >= 3 or proc.poll() is not None, 60,
                     "node0's rank to go on without the cut-off node1", every=0.5)
            time.sleep(max(0.0, cut + LINK_DOWN_S - time.time()))
            while_cut = _text(log0).split(LEFT)[-1]
        finally:
            cut_off(victim, False)
    finally:
        out, err = _finish(proc, tmp_path / "runs" / "dl-sleep")
    assert proc.returncode == 0, (out + err)[-4000:]
    assert "training.elastic.min_nodes=1 (the default under training.sync=diloco)" in out + err, (out + err)[-3000:]
    events = json.loads(status.read_text())["members"]
    assert [e["event"] for e in events] == ["left", "joined"] * 3, events
    assert events[0]["t"] - asleep < 30 and "it is asleep or frozen" in events[0]["why"], events
    assert events[4]["t"] - cut < 30 and events[5]["t"] > cut + LINK_DOWN_S, events[4:]
    assert "without a restart" in out + err, (out + err)[-3000:]
    # node0's rank went on in the same launch while node1 slept: its steps came after the leave, before any relaunch
    assert "# hrmctl launch" not in alone.split("[rank0]:step")[0], alone[-2000:]
    assert re.search(r"\[rank0\]:step \d+/", alone), "node0 stepped while node1 slept: " + alone[-2000:]
    # the kill: node0's rank found node1 gone in the launch it was in (the one after the first join), not restarted
    assert before_kill_left.count("# hrmctl launch") == 2, before_kill_left[-3000:]
    # the link cut: node0's rank went on in the launch it was in (after the kill's join), stepping while node1 was away
    assert "# hrmctl launch" not in while_cut.split("[rank0]:step")[0], while_cut[-2000:]
    assert re.search(r"\[rank0\]:step \d+/", while_cut), "node0 stepped while node1 was cut off: " + while_cut[-2000:]
    assert _text(log0).count("# hrmctl launch") == 4, "one launch, and one more each time node1 came back"
    assert _records(home / "dl-sleep")[-1]["step"] == steps
    ref_loss, loss = _final_val_loss(home / "dl-ref"), _final_val_loss(home / "dl-sleep")
    print(f"final val_loss: uninterrupted {ref_loss:.4f}, node1 asleep, killed and cut off {loss:.4f} "
          f"({(loss / ref_loss - 1) * 100:+.2f}%)")
    assert loss <= ref_loss * 1.01, (ref_loss, loss)  # no worse by more than 1%: lower is no loss of quality
    _nothing_left(lab3.nodes[:2], "dl-sleep")


def test_diloco_three_nodes_go_on_in_place_while_nodes_sleep_are_cut_off_and_killed(lab3, tmp_path):
    """training.sync=diloco on three nodes (its default training.elastic.min_nodes=1), issue 36's three faults:
    node1 (node rank 1) asleep for ASLEEP_S (every process of its namespace stopped) right after the first
    checkpoint: named within 30 s, node0's and node2's ranks find rank 1 silent at the round's all-reduce and go on
    as two in the launch they are in (not restarted), one of them taking rank 1's rows; node1 rejoins when it wakes
    (every node resumes from a checkpoint saved at an agreed step, node1 taking rank 0's weights). Then node1's link
    is cut for LINK_DOWN_S and, once it is named, every process of node2's user is killed: node0's rank goes on
    alone, not restarted; node2, answering at once, rejoins while node1 is still away (a world of node0 and node2),
    and node1 once its link is back. The run ends at max_steps with exit 0 and nothing left on any node."""
    # leaves and joins, not learning (no loss compared): a lean run (test_elastic.py), half the steps at twice the
    # pace on 2-row micro-batches, and half the steps a round, so that a round, a step line and a checkpoint come
    # as many seconds apart as at 600 steps, PACE and H = 10
    steps = 300
    lean = [a for a in LEAN_ARGS if not a.startswith("training.elastic.")]  # DiLoCo's default min_nodes, unsaid
    args = [*lean, f"training.max_steps={steps}", "training.checkpoint_interval=10", "training.sync=diloco",
            "training.diloco.inner_steps=5"]
    proc = start_hrmctl(["train", "--nodes", "node0,node1,node2", "--run-id", "dl3", *args], lab3.inventory, tmp_path)
    run = tmp_path / "runs" / "dl3"
    logs = {n: run / f"{n}.log" for n in ("node0", "node1", "node2")}
    node1, node2 = lab3.nodes[1], lab3.nodes[2]
    try:
        wait_for(lambda: "saved runs/dl3/checkpoint-10" in _text(logs["node0"]) or proc.poll() is not None, 240,
                 "the first checkpoint", every=0.5)
        assert proc.poll() is None, proc.communicate()
        asleep = time.time()
        node1.freeze(True)
        try:
            wait_for(lambda: _events(run) or proc.poll() is not None, 60,
                     "node1 to be named as left", every=0.5)
            wait_for(lambda: re.search(r"\[rank0\]:step \d+/", _text(logs["node0"]).split(LEFT)[-1]) and
                     LEFT in _text(logs["node0"]) or proc.poll() is not None, 240,
                     "node0's and node2's ranks to step on without node1", every=0.5)
            time.sleep(max(0.0, asleep + ASLEEP_S - time.time()))
            as_two = _text(logs["node0"]).split(LEFT)[-1]
        finally:
            node1.freeze(False)
        wait_for(lambda: "resuming from" in _text(logs["node0"]) and
                 re.search(r"\[rank0\]:step \d+/", _text(logs["node0"]).split("resuming from")[-1])
                 or proc.poll() is not None, 240, "node1 back in the run", every=0.5)
        assert proc.poll() is None, proc.communicate()
        cut = time.time()
        cut_off(node1, True)
        try:
            wait_for(lambda: len(_events(run)) >= 3 or proc.poll() is not None, 60, "the cut-off node1 named",
                     every=0.5)
            sh(["pkill", "-KILL", "-u", node2.user])
            wait_for(lambda: ALONE.search(_text(logs["node0"])) or proc.poll() is not None, 90,
                     "node0's rank to go on without the cut-off node1 and the killed node2", every=0.5)
            wait_for(lambda: ("node2", "joined") in _events(run) or proc.poll() is not None, 90,
                     "node2 back while node1 is cut off", every=0.5)
            time.sleep(max(0.0, cut + LINK_DOWN_S - time.time()))
        finally:
            cut_off(node1, False)
    finally:
        out, err = _finish(proc, run)
    assert proc.returncode == 0, (out + err)[-4000:]
    # what node0's rank logged once alone (read now: its next step line may come seconds after the leave's)
    alone = ALONE.split(_text(logs["node0"]), maxsplit=1)[-1]
    assert "the round goes on with ranks 0, 2, not restarted" in _text(logs["node0"]), _text(logs["node0"])[-3000:]
    # rank 2's connections broke when it was killed, and the round's collective with them: three missed beats (6 s)
    # count it out; rank 1, cut off, is silent for 15 s (or 6 s, when rank 2's kill broke the round it was silent in)
    assert re.match(r" \(silent for (15s|6s once a collective failed)\); the round goes on with ranks 0, not restarted",
                    alone), alone[:500]
    assert "rank 0 takes rank(s) 1, 2's rows beside its own" in _text(logs["node0"]), _text(logs["node0"])[-3000:]
    assert "without a restart" in out + err, (out + err)[-3000:]
    events = json.loads((run / "status.json").read_text())["members"]
    assert [(e["node"], e["event"]) for e in events] == [
        ("node1", "left"), ("node1", "joined"), ("node1", "left"), ("node2", "left"), ("node2", "joined"),
        ("node1", "joined")], events
    assert events[0]["t"] - asleep < 30 and "it is asleep or frozen" in events[0]["why"], events
    assert events[2]["t"] - cut < 30 and "its link is down" in events[2]["why"], events
    assert events[5]["t"] > cut + LINK_DOWN_S, events
    # node0's rank stepped while node1 slept, in the launch it was in; node2 was launched again only at the joins
    assert "# hrmctl launch" not in as_two.split("[rank0]:step")[0], as_two[-2000:]
    assert len(re.findall(r"\[rank0\]:step \d+/", as_two.split("# hrmctl launch")[0])) >= 3, as_two[-2000:]
    # and alone, in the launch it was in, while node1 was cut off and node2 killed: it stepped, or (node2 answering at
    # once) saved at the step agreed for node2's return, before any new launch
    assert re.search(r"\[rank0\]:(step \d+/|stopped at step \d+/\d+ on SIGUSR1)", alone.split("# hrmctl launch")[0]), \
        alone[:2000]
    heads = re.findall(r"# hrmctl launch, attempt 1(?: \(after (node\d \w+)\))?, node node2 \(node rank (\d)",
                       _text(logs["node2"]))
    assert heads == [("", "2"), ("node1 joined", "2"), ("node2 joined", "1"), ("node1 joined", "2")], heads
    launches = _text(logs["node0"]).split("# command: ")[1:]
    assert [int(re.search(r"HRMCTL_WORLD_SIZE=(\d)", c).group(1)) for c in launches] == [3, 3, 2, 3]
    assert _records(lab3.node("node0").home / "hrmctl" / "runs" / "dl3")[-1]["step"] == steps
    _nothing_left(lab3.nodes, "dl3")
