"""A node that drops off during a real two-node DDP run and comes back (training.elastic.min_nodes=1,
cli/launch/elastic.py), twice in one run: its link cut (every packet in and out of node1 dropped) for LINK_DOWN_S,
then restored; later every process of its user killed (SIGKILL). Each time node1 is named (the link: within 30 s),
node0 goes on alone from the last checkpoint (step lines keep coming), node1 rejoins once it answers (node0's rank
saves at an agreed step; both resume from it, node1 taking the weights from rank 0), and the run ends at max_steps
with exit 0, every leave and join in `hrmctl runs`, nothing left anywhere."""

from __future__ import annotations

import json
import re
import time

from lab.nodes import sh
from tests.cluster.test_launch import job_pids, start_hrmctl
from tests.polling import wait_for

LINK_DOWN_S = 30  # issue 36 asks 60 s; 30 s shows the same path (the watcher's tries fail until the link is back)
STEPS, EVERY = 350, 50


def _text(path):
    return path.read_text() if path.exists() else ""


def test_a_node_cut_off_leaves_the_run_and_rejoins_it(lab3, tmp_path):
    victim = lab3.nodes[1]
    run_dir = lab3.node("node0").home / "hrmctl" / "runs" / "el1"
    args = ["model=tiny", f"training.max_steps={STEPS}", "training.batch_size=8", "training.log_interval=10",
            f"training.checkpoint_interval={EVERY}", "training.eval_interval=0", "training.eval_batches=1",
            "training.elastic.min_nodes=1"]
    proc = start_hrmctl(["train", "--nodes", "node0,node1", "--run-id", "el1", *args], lab3.inventory, tmp_path)
    log0, log1 = tmp_path / "runs" / "el1" / "node0.log", tmp_path / "runs" / "el1" / "node1.log"
    rules = [["INPUT", "-j", "DROP"], ["OUTPUT", "-j", "DROP"]]
    try:
        wait_for(lambda: f"saved runs/el1/checkpoint-{EVERY}" in _text(log0) or proc.poll() is not None, 240,
                 "the first checkpoint", every=0.5)
        assert proc.poll() is None, proc.communicate()
        fault = time.time()
        for r in rules:
            victim.netns(["iptables", "-I", *r])
        wait_for(lambda: "# hrmctl launch, attempt 1" in _text(log0) and _text(log0).count("# hrmctl launch") >= 2
                 or proc.poll() is not None, 90, "node0 to start again without node1", every=0.5)
        time.sleep(max(0.0, fault + LINK_DOWN_S - time.time()))
        alone = _text(log0).split("# hrmctl launch")[-1]
    finally:
        for r in rules:
            victim.netns(["iptables", "-D", *r], check=False)
    try:  # back with node1 (a resume, then a step): then every process of node1's user killed
        wait_for(lambda: _text(log0).count("resuming from") >= 2 and
                 re.search(r"\[rank0\]:step \d+/", _text(log0).split("resuming from")[-1]) or proc.poll() is not None,
                 240, "node1 back in the run", every=0.5)
        sh(["pkill", "-KILL", "-u", victim.user])
    finally:
        out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, (out + err)[-4000:]
    assert "node1 stopped answering" in out + err and "node1 left at " in out + err, (out + err)[-4000:]
    assert "node1 joined at " in out + err, (out + err)[-4000:]
    assert re.search(r"\[rank0\]:step \d+/", alone), "node0 stepped while node1 was away: " + alone[-2000:]

    status = json.loads((tmp_path / "runs" / "el1" / "status.json").read_text())
    events = status["members"]
    assert [(e["node"], e["event"]) for e in events] == [("node1", "left"), ("node1", "joined")] * 2, events
    assert events[0]["t"] - fault < 30, f"node1 named {events[0]['t'] - fault:.1f}s after its link went down"
    assert events[1]["t"] > fault + LINK_DOWN_S
    code_runs = start_hrmctl(["runs", "--json"], lab3.inventory, tmp_path)
    listed = {r["id"]: r for r in json.loads(code_runs.communicate(timeout=60)[0])}
    assert [e["event"] for e in listed["el1"]["members"]] == ["left", "joined"] * 2
    table = start_hrmctl(["runs"], lab3.inventory, tmp_path).communicate(timeout=60)[0]
    assert re.search(r"el1: node1 left at \d\d:\d\d:\d\d; node1 joined at \d\d:\d\d:\d\d; node1 left", table), table

    # the work lost at the leave is at most one checkpoint interval; none at the join (resumed from the step saved)
    text0, text1 = _text(log0), _text(log1)
    starts = text0.split("# hrmctl launch, attempt")
    assert len(starts) == 6, f"five launches on node0 expected, got {len(starts) - 1}"
    before = [int(s) for s in re.findall(r"\[rank0\]:step (\d+)/", starts[1])]
    resumed = [int(s) for s in re.findall(r"resuming from \S+ \(step (\d+)\)", text0)]
    assert len(resumed) == 4 and max(before) - resumed[0] <= EVERY + 10, (before[-3:], resumed)
    saved = re.findall(r"stopped at step (\d+)/\d+ on SIGUSR1", starts[2])
    assert saved and int(saved[0]) == resumed[1], (saved, resumed)
    # node1 started again at each join, and the last launch was a world of both nodes again
    assert text1.count("# hrmctl launch, attempt") == 3, text1[-2000:]
    assert "HRMCTL_WORLD_SIZE=2 " in starts[-1].split("# command: ")[1].splitlines()[0]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == STEPS
    for node in lab3.nodes[:2]:
        wait_for(lambda: job_pids(node, "el1") == [], 40, f"the run's processes on {node.name} to be gone")
