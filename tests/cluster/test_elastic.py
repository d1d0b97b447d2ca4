"""A node that drops off during a real two-node DDP run and comes back (training.elastic.min_nodes=1,
cli/launch/supervise/elastic.py), three times in one run: its link cut (every packet in and out of node1 dropped) for
LINK_DOWN_S, then restored; every process of its user killed (SIGKILL); the whole node asleep for ASLEEP_S (SIGSTOP
to every process of its namespace, sshd too), then woken. Each time node1 is named (link and sleep: within 30 s),
node0 goes on alone from the last checkpoint (step lines keep coming), node1 rejoins once it answers (node0's rank
saves at an agreed step; both resume from it, node1 taking the weights from rank 0), and the run ends at max_steps
with exit 0, every leave and join in `hrmctl runs`, nothing left anywhere. And a three-node DDP run with the same
three faults, going on as two and as one. The same faults under DiLoCo (not restarted): test_elastic_diloco.py."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

from lab.nodes import sh
from tests.cluster.test_launch import job_pids, start_hrmctl
from tests.polling import wait_for

# the whole suite runs this file beside the tests outside the cluster tier (scripts/test.sh): slower than alone
pytestmark = pytest.mark.timeout(1500)

LINK_DOWN_S = ASLEEP_S = 60  # issue 36's faults: 60 s each
PACE = 0.3  # seconds each step sleeps (fault.step_sleep), so that node0 alone (at most 3.3 steps a second then) does
# not reach max_steps (600) while node1 is away: test_elastic_diloco.py's run compared with an uninterrupted one
# The "lean" runs test leaves and joins, not learning (this file's DDP runs, the three-node DiLoCo one): half the
# steps at twice the pace (the same seconds of run, the faults' windows in the same proportion to it), on
# micro-batches of 2 rows, with a step line every 5 steps (as often in seconds as every 10 at PACE). Their steps'
# CPU, beside the rest of the suite, is about a quarter of what 600 steps of 8 rows at PACE took.
LEAN_STEPS, EVERY, LEAN_PACE = 300, 12, 0.6
LEAN_ARGS = ["model=tiny", "training.batch_size=2", "training.log_interval=5", "training.eval_interval=0",
            "training.eval_batches=1", "training.elastic.min_nodes=1", f"fault.step_sleep={LEAN_PACE}",
            "logging.curves=false"]


def _text(path):
    return path.read_text() if path.exists() else ""


def _records(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _asleep(victim, log0, proc, launches: int) -> tuple[float, str]:
    """node1 asleep for ASLEEP_S (every process of its namespace stopped), and woken even when a wait fails: when it
    fell asleep, and node0's log since its launch without it (launch number ``launches``)."""
    asleep = time.time()
    victim.freeze(True)
    try:
        stepping(log0, proc, launches, "node0 to start again without the sleeping node1, and step")
        time.sleep(max(0.0, asleep + ASLEEP_S - time.time()))
        return asleep, _text(log0).split("# hrmctl launch")[-1]
    finally:
        victim.freeze(False)


def stepping(log, proc, launches: int, what: str) -> None:
    """Wait until node0 has been launched ``launches`` times (its log) and has logged a step in the last launch, or
    the run has ended. A fault lasts at least its window and until then: how long a restart takes to its first step
    depends on the machine (on a fresh 2-core one under the suite's load it took over 60 s), what is tested does not.
    240 s: a restart took 20-30 s here, and three times that on a machine three times slower"""
    wait_for(lambda: _text(log).count("# hrmctl launch") >= launches and
             re.search(r"\[rank0\]:step \d+/", _text(log).split("# hrmctl launch")[-1]) or proc.poll() is not None,
             240, what, every=0.5)
    assert proc.poll() is None, proc.communicate()


def cut_off(node, on: bool) -> None:
    """Every packet in and out of ``node`` dropped (its link down), or let through again (a no-op when it is)."""
    for rule in (["INPUT", "-j", "DROP"], ["OUTPUT", "-j", "DROP"]):
        node.netns(["iptables", "-I" if on else "-D", *rule], check=on)


def _finish(proc, run_dir, timeout: float = 900) -> tuple[str, str]:
    """The run's output once it has ended; past the timeout it is stopped (Ctrl-C, then kill) and the test fails
    with the tail of its output and of each node's log, so that a run that hung says where."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        logs = "".join(f"\n--- {p.name}:\n{p.read_text()[-2500:]}" for p in sorted(run_dir.glob("node*.log")))
        pytest.fail(f"the run had not ended {timeout:.0f}s after its faults:\n{(out + err)[-2500:]}{logs}")


def _nothing_left(nodes, run_id: str) -> None:
    for node in nodes:
        wait_for(lambda: job_pids(node, run_id) == [], 40, f"the run's processes on {node.name} to be gone")


def test_a_node_cut_off_leaves_the_run_and_rejoins_it(lab3, tmp_path):
    victim = lab3.nodes[1]
    run_dir = lab3.node("node0").home / "hrmctl" / "runs" / "el1"
    args = [*LEAN_ARGS, f"training.max_steps={LEAN_STEPS}", f"training.checkpoint_interval={EVERY}"]
    proc = start_hrmctl(["train", "--nodes", "node0,node1", "--run-id", "el1", *args], lab3.inventory, tmp_path)
    log0, log1 = tmp_path / "runs" / "el1" / "node0.log", tmp_path / "runs" / "el1" / "node1.log"
    try:
        wait_for(lambda: f"saved runs/el1/checkpoint-{EVERY}" in _text(log0) or proc.poll() is not None, 240,
                 "the first checkpoint", every=0.5)
        assert proc.poll() is None, proc.communicate()
        fault = time.time()
        cut_off(victim, True)
        stepping(log0, proc, 2, "node0 to start again without node1, and step")
        time.sleep(max(0.0, fault + LINK_DOWN_S - time.time()))
        alone = _text(log0).split("# hrmctl launch")[-1]
    finally:
        cut_off(victim, False)
    def back(resumes: int) -> None:  # node1 in the run again: node0's rank resumed with it, then stepped
        wait_for(lambda: _text(log0).count("resuming from") >= resumes and
                 re.search(r"\[rank0\]:step \d+/", _text(log0).split("resuming from")[-1]) or proc.poll() is not None,
                 240, "node1 back in the run", every=0.5)
        assert proc.poll() is None, proc.communicate()

    try:  # back: then every process of node1's user killed; back again: then the whole node asleep for ASLEEP_S
        back(2)
        sh(["pkill", "-KILL", "-u", victim.user])
        back(4)
        asleep, alone_asleep = _asleep(victim, log0, proc, 6)
    finally:
        out, err = _finish(proc, tmp_path / "runs" / "el1")
    assert proc.returncode == 0, (out + err)[-4000:]
    assert "node1 stopped answering" in out + err and "node1 left at " in out + err, (out + err)[-4000:]
    assert "node1 joined at " in out + err, (out + err)[-4000:]
    assert re.search(r"\[rank0\]:step \d+/", alone), "node0 stepped while node1 was away: " + alone[-2000:]

    status = json.loads((tmp_path / "runs" / "el1" / "status.json").read_text())
    events = status["members"]
    assert [(e["node"], e["event"]) for e in events] == [("node1", "left"), ("node1", "joined")] * 3, events
    assert events[0]["t"] - fault < 30, f"node1 named {events[0]['t'] - fault:.1f}s after its link went down"
    assert events[1]["t"] > fault + LINK_DOWN_S
    assert events[4]["t"] - asleep < 30, f"node1 named {events[4]['t'] - asleep:.1f}s after it went to sleep"
    assert "it is asleep or frozen" in events[4]["why"] and events[5]["t"] > asleep + ASLEEP_S, events[4:]
    assert re.search(r"\[rank0\]:step \d+/", alone_asleep), "node0 stepped while node1 slept: " + alone_asleep[-2000:]
    code_runs = start_hrmctl(["runs", "--json"], lab3.inventory, tmp_path)
    listed = {r["id"]: r for r in json.loads(code_runs.communicate(timeout=60)[0])}
    assert [e["event"] for e in listed["el1"]["members"]] == ["left", "joined"] * 3
    table = start_hrmctl(["runs"], lab3.inventory, tmp_path).communicate(timeout=60)[0]
    assert re.search(r"el1: node1 left at \d\d:\d\d:\d\d; node1 joined at \d\d:\d\d:\d\d; node1 left", table), table

    # the work lost at the leave is at most one checkpoint interval; none at the join (resumed from the step saved)
    text0, text1 = _text(log0), _text(log1)
    starts = text0.split("# hrmctl launch, attempt")
    assert len(starts) == 8, f"seven launches on node0 expected, got {len(starts) - 1}"
    before = [int(s) for s in re.findall(r"\[rank0\]:step (\d+)/", starts[1])]
    resumed = [int(s) for s in re.findall(r"resuming from \S+ \(step (\d+)\)", text0)]
    assert len(resumed) == 6 and max(before) - resumed[0] <= EVERY + 10, (before[-3:], resumed)
    saved = re.findall(r"stopped at step (\d+)/\d+ on SIGUSR1", starts[2])
    assert saved and int(saved[0]) == resumed[1], (saved, resumed)
    # node1 started again at each join, and the last launch was a world of both nodes again
    assert text1.count("# hrmctl launch, attempt") == 4, text1[-2000:]
    assert "HRMCTL_WORLD_SIZE=2 " in starts[-1].split("# command: ")[1].splitlines()[0]
    assert _records(run_dir)[-1]["step"] == LEAN_STEPS
    _nothing_left(lab3.nodes[:2], "el1")


def test_three_nodes_go_on_as_two_and_as_one_and_take_the_others_back(lab3, tmp_path):
    """A three-node DDP run with training.elastic.min_nodes=1 and issue 36's three faults: every process of node1
    (node rank 1) killed: node0 and node2 go on as a world of two (node2 now node rank 1; the global batch of 3
    ranks does not split over 2 by accumulation, which the log says), node1 rejoins as node rank 1 (node2 back to 2).
    Then node1's link cut for LINK_DOWN_S, and once node0 and node2 step as two, node2 asleep for ASLEEP_S: node0
    goes on alone; node1 rejoins once its link is back, node2 once it wakes. Each named (link and sleep: within
    30 s); the run ends at max_steps with exit 0 and nothing left on any node."""
    steps = 225  # at LEAN_PACE, at least 135 s of steps: the faults take about 130 s, restarts included, and ended by
    # step 176 of 600 at PACE (88 at LEAN_PACE) in a run with two threads a rank (2-core machine, 2026-11-27)
    args = [*LEAN_ARGS, f"training.max_steps={steps}", "training.checkpoint_interval=10"]
    proc = start_hrmctl(["train", "--nodes", "node0,node1,node2", "--run-id", "el3", *args], lab3.inventory, tmp_path)
    run = tmp_path / "runs" / "el3"
    logs = {n: run / f"{n}.log" for n in ("node0", "node1", "node2")}
    node1, node2 = lab3.nodes[1], lab3.nodes[2]

    try:
        wait_for(lambda: "saved runs/el3/checkpoint-10" in _text(logs["node0"]) or proc.poll() is not None, 240,
                 "the first checkpoint", every=0.5)
        assert proc.poll() is None, proc.communicate()
        sh(["pkill", "-KILL", "-u", node1.user])
        stepping(logs["node0"], proc, 3, "node1 back after the kill")
        cut = time.time()
        cut_off(node1, True)
        try:
            stepping(logs["node0"], proc, 4, "node0 and node2 stepping as two while node1 is cut off")
            as_two = _text(logs["node0"]).split("# hrmctl launch")[-1]
            asleep = time.time()
            node2.freeze(True)
            try:
                stepping(logs["node0"], proc, 5, "node0 stepping alone while node1 is cut off and node2 asleep")
                alone = _text(logs["node0"]).split("# hrmctl launch")[-1]
                time.sleep(max(0.0, cut + LINK_DOWN_S - time.time()))
                cut_off(node1, False)  # node1 back first, node2 still asleep
                time.sleep(max(0.0, asleep + ASLEEP_S - time.time()))
            finally:
                node2.freeze(False)
        finally:
            cut_off(node1, False)
    finally:
        out, err = _finish(proc, run)
    assert proc.returncode == 0, (out + err)[-4000:]
    assert "the global batch changes: 3 ranks' worth of training.grad_accum=1 does not split over 2 ranks" in out + err
    events = json.loads((run / "status.json").read_text())["members"]
    # node1's link comes back before node2 wakes, but which of them is taken back first depends on the machine's
    # speed (the watcher's SSH connect against node2's rank catching up): either order, each after its fault ended
    order = [(e["node"], e["event"]) for e in events]
    assert order[:4] == [("node1", "left"), ("node1", "joined"), ("node1", "left"), ("node2", "left")], order
    assert sorted(order[4:]) == [("node1", "joined"), ("node2", "joined")], order
    back = {e["node"]: e["t"] for e in events[4:]}
    assert back["node1"] > cut + LINK_DOWN_S and back["node2"] > asleep + ASLEEP_S, events
    node1_first = order[4][0] == "node1"
    assert events[2]["t"] - cut < 30 and "its link is down" in events[2]["why"], events
    assert events[3]["t"] - asleep < 30 and "it is asleep or frozen" in events[3]["why"], events
    assert re.search(r"\[rank0\]:step \d+/", as_two) and re.search(r"\[rank0\]:step \d+/", alone), (as_two, alone)
    heads = re.findall(r"# hrmctl launch, attempt 1(?: \(after (node\d \w+)\))?, node node2 \(node rank (\d)",
                       _text(logs["node2"]))
    # node2 relaunched at each change of a world it is in: asleep, it is in none until it joins (node rank 2 beside
    # node1 back, else 1, and 2 again when node1 joins after it)
    last = [("node2 joined", "2")] if node1_first else [("node2 joined", "1"), ("node1 joined", "2")]
    assert heads == [("", "2"), ("node1 left", "1"), ("node1 joined", "2"), ("node1 left", "1"), *last], heads
    launches = _text(logs["node0"]).split("# command: ")[1:]
    worlds = [int(re.search(r"HRMCTL_WORLD_SIZE=(\d)", c).group(1)) for c in launches]
    assert worlds == [3, 2, 3, 2, 1, 2, 3], worlds
    assert _records(lab3.node("node0").home / "hrmctl" / "runs" / "el3")[-1]["step"] == steps
    _nothing_left(lab3.nodes, "el3")
