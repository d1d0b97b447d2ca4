"""Low-communication training and work shares on real lab nodes: `hrmctl train` with DiLoCo over a link
shaped to 50 Mbit/s +10 ms, and measured shares with one node held to half a core by a cgroup quota."""

from __future__ import annotations

import json
import pytest


def _run_dir(lab3, run_id: str):
    return lab3.node("node0").home / "hrmctl" / "runs" / run_id


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("overlap", [0, 2])
def test_diloco_trains_two_nodes_over_a_slow_link_and_ends_with_equal_weights(lab3, hrmctl, text_on_nodes, overlap):
    node1 = lab3.node("node1")
    node1.shape_link(50, 10)
    try:
        code, out, err = hrmctl("train", "--nodes", "node0,node1", "--run-id", f"diloco-slow-{overlap}", "task=lm",
                                f"data_dir={text_on_nodes}", "model=tiny", "training.batch_size=8",
                                "training.max_steps=12", "training.sync=diloco", "training.diloco.inner_steps=4",
                                f"training.diloco.overlap_steps={overlap}",
                                "training.checkpoint_interval=6", "training.log_interval=2", "logging.curves=false",
                                inventory=lab3.inventory, timeout=300)
    finally:
        node1.shape_link(None)
    assert code == 0, out + err
    assert "sync: diloco, 4 local steps a round" in out
    assert ("overlaps the next round's first 2 local steps" in out) == (overlap == 2)
    assert ("outer step: the ranks' plain average (lr 1, momentum 0), chosen by training.diloco.outer_lr=auto for 3 "
            "round(s) of 4 local steps") in out  # the default on a short run; the paper's step would warn
    assert "warning: diloco:" not in out
    run = _run_dir(lab3, f"diloco-slow-{overlap}")
    assert [r["step"] for r in _jsonl(run / "metrics.jsonl")] == [4, 8, 12]  # a record at each round's end
    assert (run / "checkpoint-8" / "diloco.pt").is_file()  # interval 6 falls inside a round: saved at its end
    checksum = [e for e in _jsonl(run / "events.jsonl") if e["kind"] == "checksum"][-1]
    assert checksum["equal"] and len(checksum["checksums"]) == 2


@pytest.mark.alone  # one node at half a core against a whole one: nothing else may share those cores
def test_auto_shares_give_the_node_at_half_a_core_a_smaller_part_of_the_batch(lab3, hrmctl, text_on_nodes):
    lab3.node("node0").limit_cpu(cpus="0")
    lab3.node("node1").limit_cpu(cpus="1", quota=0.5)
    try:
        code, out, err = hrmctl("train", "--nodes", "node0,node1", "--run-id", "auto-shares", "task=lm",
                                f"data_dir={text_on_nodes}", "model=mini", "training.batch_size=16",
                                "training.max_steps=4", "training.balance=auto", "training.dtype=fp32",
                                "logging.curves=false",
                                inventory=lab3.inventory, timeout=300)
    finally:
        for node in ("node0", "node1"):
            lab3.node(node).limit_cpu()
    assert code == 0, out + err
    (shares,) = [e for e in _jsonl(_run_dir(lab3, "auto-shares") / "events.jsonl") if e["kind"] == "balance"]
    assert shares["nodes"] == ["node0", "node1"] and sum(shares["batch"]) == 32
    fast, slow = shares["weights"]
    # half a core: about half the speed. Its quota is 50 ms of each 100 ms (cgroup cpu.max), and the probe's few steps
    # fall on that rhythm as they may, beside the launcher's own processes on the same core: 2.0-3.3 measured (a
    # warm CI, 2026-12-06: 3.27; 5.44 in a warm CI on a 2-core Xeon with AMX, 2026-12-07), so the bound above is loose:
    # it catches a rate that is no measurement (a start-up timed, a rank's rate for another's); what the test asserts
    # is the order and the shares
    assert 1.4 < fast / slow < 10.0, shares
    assert shares["batch"][0] > shares["batch"][1] >= 1
    assert "balance auto: rank 0 (node0): measured rows/s" in out
