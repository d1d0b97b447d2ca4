"""`hrmctl doctor` on real sshd nodes, each fault made for real inside a node's namespace."""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import contextmanager

import pytest

from lab.nodes import ROOT, SYSTEM_PYTHON
from lab.nfq_delay import delayed_inbound

# The --timeout of a doctor run whose healthy nodes must report torch: the first import of torch on a fresh 2-core
# machine under the suite's load took over 10 s (issue 63: `--timeout 10` gave those nodes no torch row), 12 s cold
# at a load average of 13 here; 120 s (the default) is room for a machine three times slower, and more.
HEALTHY_TIMEOUT_S = 120
SSH_CONNECT_S = 10  # the doctor's SSH connect waits at most min(--timeout, 10) s
# a doctor run as a whole: its nodes' --timeout, plus its start, the network phase and the rendering (a few
# seconds here), with room for a machine three times slower
RUN_SLACK_S = 60
DOCTOR_LIMIT_S = HEALTHY_TIMEOUT_S + RUN_SLACK_S + 60  # the test's own limit on one hrmctl doctor: only a hang meets it

# These checks are about the node itself or the network; "project" depends on the tree the lab copied.
NETWORK_ROWS = ("ssh", "os", "python", "torch", "nccl/gloo", "libuv", "interface", "hostname", "reach", "clock",
                "master port", "mesh")


def doctor_json(hrmctl, inventory, *args, timeout=DOCTOR_LIMIT_S):
    code, out, err = hrmctl("doctor", "--json", *args, inventory=inventory, timeout=timeout)
    assert "Traceback" not in out + err, err
    return code, json.loads(out), err


def status(doc, node, check):
    return doc["nodes"][node]["checks"][check]["status"]


@contextmanager
def iptables(lab_node, *rule):
    lab_node.netns(["iptables", "-I", *rule])
    try:
        yield
    finally:
        lab_node.netns(["iptables", "-D", *rule], check=False)


def within_clock_bound(clock: dict, truth_ms: float) -> bool:
    """The measured offset is the truth within 50 ms, or within the error bound the measure states (half its best
    round trip) where a loaded machine makes that bound wider."""
    return abs(clock["offset_ms"] - truth_ms) <= max(50.0, clock["error_ms"] + 0.01)


def local_tree_dirty() -> bool:
    res = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True)
    return bool(res.stdout.strip())


def test_healthy_cluster_is_all_ok(lab3, hrmctl):
    code, doc, err = doctor_json(hrmctl, lab3.inventory)
    assert code == 0, err
    assert doc["master"] == "node0" and doc["master_address"] == lab3.nodes[0].ip
    for lab_node in lab3.nodes:
        checks = doc["nodes"][lab_node.name]["checks"]
        bad = {k: v for k, v in checks.items() if v["status"] not in ("ok", "skip")}
        if not local_tree_dirty():  # the lab copies this working tree, uncommitted edits included
            assert not bad, bad
        assert set(bad) <= {"project"}, bad
        for row in NETWORK_ROWS:
            assert checks[row]["status"] == "ok", (lab_node.name, row, checks[row])
        probe = doc["nodes"][lab_node.name]["probe"]
        assert probe["hostname"] == lab_node.name and probe["route_ifname"] == "eth0"
        assert probe["route_src"] == lab_node.ip and probe["libuv_ok"] is True
        assert within_clock_bound(doc["nodes"][lab_node.name]["clock"], 0.0)
        # resources from psutil (the nodes' Python has it): load average and available memory shown
        assert doc["nodes"][lab_node.name]["probe_raw"]["resources"]["source"] == "psutil"
        assert len(probe["load_avg"]) == 3 and 0 < probe["mem_available_gb"] <= probe["ram_gb"]
        assert "GB RAM (" in checks["resources"]["detail"] and ", load " in checks["resources"]["detail"]
    cluster = doc["cluster"]
    assert cluster["torch versions"]["status"] == "ok" and cluster["backend"]["detail"].startswith("gloo")
    assert doc["summary"]["fail"] == 0 and doc["exit_code"] == 0


@pytest.mark.alone  # the healthy node's round trips must stay under 30 ms: with three test processes and the elastic
# tests' runs on two cores, one of node1's went over once (ci55, 2026-11-29)
def test_latency_and_loss_on_one_node_show_in_its_round_trips(lab3, hrmctl):
    node2 = lab3.node("node2")
    # 60 ms on every packet arriving at node2 (NFQUEUE delayer), and half its incoming pings dropped
    with delayed_inbound(node2, 60), \
            iptables(node2, "INPUT", "-i", "eth0", "-p", "icmp", "-m", "statistic", "--mode", "random",
                     "--probability", "0.5", "-j", "DROP"):
        code, doc, err = doctor_json(hrmctl, lab3.inventory)
    slow = doc["nodes"]["node2"]
    assert slow["rtt_here"]["min_ms"] >= 59 and slow["rtt_here"]["loss_pct"] > 0, slow["rtt_here"]
    assert slow["rtt_to_master"]["min_ms"] >= 59, slow["rtt_to_master"]  # node0's answers arrive late at node2
    assert status(doc, "node2", "reach") in ("warn", "fail") and status(doc, "node2", "to master") == "warn"
    assert "fix" in json.dumps(slow["checks"]["reach"]) and slow["checks"]["reach"]["fix"]
    fast = doc["nodes"]["node1"]
    assert fast["rtt_here"]["avg_ms"] < 20 and fast["rtt_here"]["loss_pct"] == 0
    assert status(doc, "node1", "reach") == "ok" and status(doc, "node1", "to master") == "ok"
    assert status(doc, "node2", "master port") == "ok"  # slow is not blocked


def test_firewall_on_master_port_fails_naming_the_worker(lab3, hrmctl):
    node0, node1 = lab3.node("node0"), lab3.node("node1")
    with iptables(node0, "INPUT", "-p", "tcp", "-s", node1.ip, "--dport", "29500", "-j", "DROP"):
        code, out, err = hrmctl("doctor", "--master-port", "29500", inventory=lab3.inventory, timeout=DOCTOR_LIMIT_S)
    assert code == 1, out + err
    assert f"node1 cannot reach node0 ({node0.ip}):29500" in out
    fails = [l for l in out.splitlines() if l.startswith("fail")]
    assert len(fails) == 1 and "node1 · master port" in fails[0], out
    after = out.split(fails[0], 1)[1].splitlines()[1]
    assert after.strip().startswith("fix:") and "allow TCP 29500" in after
    assert "not ready" in out.splitlines()[-1]


def test_firewall_passing_rendezvous_but_not_high_ports_fails_the_mesh(lab3, hrmctl):
    """node0 drops node1's connects to its high ports: node1 (the higher address) is the side gloo dials
    from in that pair, so the first collective would hang. The other direction works, which is not enough."""
    node0, node1 = lab3.node("node0"), lab3.node("node1")
    # node0 lets node1 reach ssh and the master port, but drops node1's new connections to every other port
    # (only SYNs, as a stateful firewall does: node0's own connections to node1 still get their answers)
    with iptables(node0, "INPUT", "-p", "tcp", "--syn", "-s", node1.ip, "-m", "multiport", "!", "--dports", "22,29500",
                  "-j", "DROP"):
        code, doc, err = doctor_json(hrmctl, lab3.inventory)
    assert code == 1
    assert status(doc, "node1", "master port") == "ok"
    assert status(doc, "node0", "mesh") == "fail" and status(doc, "node1", "mesh") == "fail"
    assert "not reachable from node1" in doc["nodes"]["node0"]["checks"]["mesh"]["detail"]
    assert "cannot reach node0" in doc["nodes"]["node1"]["checks"]["mesh"]["detail"]
    assert "gloo needs node1 -> node0: training hangs" in doc["nodes"]["node1"]["checks"]["mesh"]["detail"]
    fix = doc["nodes"]["node0"]["checks"]["mesh"]["fix"]
    assert fix.startswith("on node0: `sudo ufw allow proto tcp from") and "ip_local_port_range" in fix
    assert status(doc, "node2", "mesh") == "ok"  # only the node0 <- node1 direction is blocked
    dirs = {(d["from"], d["to"]): d for d in doc["mesh"]["directions"]}
    assert not dirs[("node1", "node0")]["ok"] and dirs[("node1", "node0")]["needed"]
    assert dirs[("node0", "node1")]["ok"] and doc["mesh"]["training_affected"] is True


def inbound_high_ports_dropped(lab_node):
    """The node's firewall drops every new inbound TCP connection to a high port (ssh on 22 still passes)."""
    return iptables(lab_node, "INPUT", "-i", "eth0", "-p", "tcp", "--syn", "--dport", "1024:65535", "-j", "DROP")


TRAIN_2_STEPS = ["model=tiny", "training.max_steps=2", "training.batch_size=8", "training.log_interval=1",
                 "training.checkpoint_interval=0", "training.eval_interval=0", "training.eval_batches=1",
                 "logging.curves=false"]


def test_node_refusing_inbound_warns_naming_it_and_two_nodes_still_train(lab3, hrmctl, tmp_path):
    """node1 accepts no inbound on high ports. With node0 (a lower address) gloo's one connection is dialled
    by node1, so the doctor warns, names node1 and says training is not affected; a real train proves it."""
    node1 = lab3.node("node1")
    with inbound_high_ports_dropped(node1):
        code, doc, err = doctor_json(hrmctl, lab3.inventory, "--nodes", "node0,node1")
        assert code == 0, doc["nodes"]["node1"]["checks"]
        mesh1 = doc["nodes"]["node1"]["checks"]["mesh"]
        assert mesh1["status"] == "warn", mesh1
        assert "node1 accepts no inbound TCP on high ports (from node0): its firewall" in mesh1["detail"]
        assert "training with gloo is not affected (gloo dials node1 -> node0, which works)" in mesh1["detail"]
        assert mesh1["fix"].startswith("on node1: `sudo ufw allow proto tcp from ") and "on node0" not in mesh1["fix"]
        mesh0 = doc["nodes"]["node0"]["checks"]["mesh"]
        assert mesh0["status"] == "warn" and "cannot reach node1 (node1's firewall)" in mesh0["detail"]
        assert mesh0["fix"].startswith("on node1:") and "on node0" not in mesh0["fix"]
        assert doc["mesh"]["closed_inbound"] == ["node1"] and doc["mesh"]["training_affected"] is False
        assert [(d["from"], d["to"], d["ok"], d["needed"]) for d in doc["mesh"]["directions"]] == [
            ("node0", "node1", False, False), ("node1", "node0", True, True)]
        code, out, err = hrmctl("train", "--nodes", "node0,node1", "--run-id", "fw1", *TRAIN_2_STEPS,
                                inventory=lab3.inventory, timeout=300)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "[rank0]:step 2/2" in (tmp_path / "runs" / "fw1" / "node0.log").read_text()


def test_node_refusing_inbound_fails_when_gloo_must_dial_it(lab3, hrmctl):
    """The same firewall with node2 in the world: node2 has the higher address, so gloo's connection of
    that pair is dialled from node2 to node1, and the first collective hangs (seen for real: a 3-node
    test-ddp times out after 120 s). The verbose table lists each direction."""
    node1 = lab3.node("node1")
    with inbound_high_ports_dropped(node1):
        code, out, err = hrmctl("doctor", "--verbose", inventory=lab3.inventory, timeout=DOCTOR_LIMIT_S)
    assert code == 1, out + err
    text = " ".join(out.split())
    assert ("fail node1 · mesh: node1 accepts no inbound TCP on high ports (from node0, node2): its firewall; "
            "gloo needs node2 -> node1: training hangs at the first collective") in text
    assert "fix: on node1: `sudo ufw allow proto tcp from" in text
    assert "fail node2 · mesh: cannot reach node1 (node1's firewall); gloo needs node2 -> node1" in text
    assert "warn node0 · mesh: cannot reach node1 (node1's firewall); training with gloo is not affected" in text
    assert "node2 -> node1: blocked (" in text and "node1 -> node2: ok" in text
    assert "node0 -> node1: blocked" in text and ", not used by gloo" in text


def test_pair_blocked_both_ways_fails_the_mesh(lab3, hrmctl):
    node1, node2 = lab3.node("node1"), lab3.node("node2")
    with iptables(node1, "INPUT", "-p", "tcp", "-s", node2.ip, "--dport", "1024:65535", "-j", "DROP"), \
            iptables(node2, "INPUT", "-p", "tcp", "-s", node1.ip, "--dport", "1024:65535", "-j", "DROP"):
        code, doc, err = doctor_json(hrmctl, lab3.inventory)
    assert code == 1
    for a, b in (("node1", "node2"), ("node2", "node1")):
        mesh = doc["nodes"][a]["checks"]["mesh"]
        assert mesh["status"] == "fail" and f"no direction works with {b}" in mesh["detail"], mesh
        assert "gloo needs node2 -> node1" in mesh["detail"]
    assert status(doc, "node0", "mesh") == "ok" and doc["mesh"]["dead_pairs"] == [["node1", "node2"]]
    assert doc["mesh"]["closed_inbound"] == []  # each still accepts node0
    assert doc["nodes"]["node1"]["checks"]["mesh"]["fix"].startswith("on node1:")  # gloo's direction lands there


def test_clock_shifted_5s_is_reported_within_50ms(lab3, hrmctl):
    node1 = lab3.node("node1")
    node1.shift_clock(5.0)  # libfaketime in the node's SSH sessions
    try:
        code, doc, err = doctor_json(hrmctl, lab3.inventory)
    finally:
        node1.shift_clock(None)
    clock = doc["nodes"]["node1"]["clock"]
    assert within_clock_bound(clock, 5000.0), clock
    assert status(doc, "node1", "clock") == "fail" and "timedatectl" in doc["nodes"]["node1"]["checks"]["clock"]["fix"]
    for other in ("node0", "node2"):
        assert within_clock_bound(doc["nodes"][other]["clock"], 0.0) and status(doc, other, "clock") == "ok"
    assert code == 1


def test_node_without_torch_says_so(lab3, hrmctl, tmp_path):
    inv = tmp_path / "hrmctl.toml"
    text = lab3.inventory.read_text()
    node2_table = f'[nodes.node2]\nhost = "{lab3.node("node2").ip}"\n'
    assert node2_table in text
    inv.write_text(text.replace(node2_table, node2_table + f'python = "{SYSTEM_PYTHON}"\n'))
    code, doc, err = doctor_json(hrmctl, inv, "--nodes", "node0,node2")
    assert code == 1
    torch = doc["nodes"]["node2"]["checks"]["torch"]
    assert torch["status"] == "fail" and f"no torch for {SYSTEM_PYTHON}" in torch["detail"]
    assert f"{SYSTEM_PYTHON} -m pip install torch" in torch["fix"]
    assert status(doc, "node2", "python") == "ok" and status(doc, "node2", "mesh") == "ok"  # the rest still reported
    assert status(doc, "node0", "torch") == "ok"
    assert doc["cluster"]["backend"]["status"] == "skip"


def test_two_nodes_holding_different_data_fail_the_dataset_check(lab3, hrmctl, tmp_path):
    """issue 33, item 7: the check looked for manifest.json; prepare-data writes meta.json. Data sets made by
    prepare-data in the nodes' data_dir: the default sudoku data alike on all three (ok), then a data set whose
    node1 copy was made with other options (fail, naming node1 and its sync-data), node2 lacking it."""
    import shutil

    from lab.nodes import sh
    from tests.trainer.helpers import prepare_data

    code, doc, err = doctor_json(hrmctl, lab3.inventory)
    assert doc["cluster"]["dataset"]["status"] == "ok", doc["cluster"]["dataset"]
    assert "sudoku" in doc["cluster"]["dataset"]["detail"]
    made = {}
    for name, train in (("node0", "20"), ("node1", "21")):
        made[name] = tmp_path / name / "issue33"
        assert prepare_data(["--task", "sudoku", "--out", str(made[name]), "--train", train, "--test", "5"]) == 0
    targets = []
    try:
        for name, src in made.items():
            node = lab3.node(name)
            targets.append(node.home / "hrmctl" / "data" / "issue33")
            shutil.copytree(src, targets[-1])
            sh(["chown", "-R", f"{node.user}:{node.user}", str(targets[-1])])
        code, doc, err = doctor_json(hrmctl, lab3.inventory)
    finally:
        for t in targets:
            shutil.rmtree(t, ignore_errors=True)
    check = doc["cluster"]["dataset"]
    assert code == 1 and check["status"] == "fail", check
    assert check["detail"].startswith("different prepared data: issue33: ") and "on node1" in check["detail"], check
    assert "`hrmctl sync-data node1`" in check["fix"] and "`hrmctl sync-data node2`" in check["fix"], check


def test_down_node_fails_in_bounded_time_while_others_report(lab3, hrmctl):
    """node2 answers nothing: its row fails once the SSH connect's own limit (min(--timeout, 10) s, a timer) has
    passed, and the whole run stays within the --timeout given; the healthy nodes, given a timeout that fits a slow
    machine (HEALTHY_TIMEOUT_S), report every check."""
    node2 = lab3.node("node2")
    with iptables(node2, "INPUT", "-i", "eth0", "-j", "DROP"):  # node2 answers nothing at all
        t0 = time.monotonic()
        code, doc, err = doctor_json(hrmctl, lab3.inventory, "--timeout", str(HEALTHY_TIMEOUT_S))
        elapsed = time.monotonic() - t0
    assert code == 1
    connect_s = min(HEALTHY_TIMEOUT_S, SSH_CONNECT_S)
    # the down node's own time is its connect's timer, plus 5 s for a loaded machine's threads to be scheduled
    assert doc["nodes"]["node2"]["seconds"] <= connect_s + 5, f"a down node took {doc['nodes']['node2']['seconds']}s"
    assert elapsed < HEALTHY_TIMEOUT_S + RUN_SLACK_S, f"a down node held doctor for {elapsed:.1f}s"
    down = doc["nodes"]["node2"]["checks"]
    assert down["ssh"]["status"] == "fail" and f"within {connect_s}s" in down["ssh"]["detail"]
    assert down["reach"]["status"] == "fail"
    for name in ("node0", "node1"):
        assert status(doc, name, "torch") == "ok" and status(doc, name, "clock") == "ok"
    assert status(doc, "node1", "master port") == "ok"


def test_unreachable_master_and_no_reachable_node(lab3, hrmctl):
    node0 = lab3.node("node0")
    with iptables(node0, "INPUT", "-i", "eth0", "-p", "tcp", "--dport", "22", "-j", "DROP"):
        code, out, err = hrmctl("doctor", "--timeout", "3", inventory=lab3.inventory, timeout=60)
        code2, out2, err2 = hrmctl("doctor", "--timeout", "3", "--nodes", "node0", inventory=lab3.inventory,
                                   timeout=60)
    assert code == 1 and "Traceback" not in out + err
    problem = [l for l in out.splitlines() if "the master node0 is unreachable" in l]
    assert len(problem) == 1 and "within 3s" in problem[0], out
    assert code2 == 3 and out2 == ""
    lines = err2.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: none of the nodes node0 could be reached"), err2


def test_python_answering_garbage_is_a_failed_check_not_a_crash(lab3, hrmctl, tmp_path):
    inv = tmp_path / "hrmctl.toml"
    text = lab3.inventory.read_text()
    table = f'[nodes.node1]\nhost = "{lab3.node("node1").ip}"\n'
    inv.write_text(text.replace(table, table + 'python = "/bin/echo"\n'))  # "runs", prints its arguments
    # node1's "python" answers at once; node0's probe must import torch: a timeout that fits a slow machine
    code, doc, err = doctor_json(hrmctl, inv, "--nodes", "node0,node1", "--timeout", str(HEALTHY_TIMEOUT_S))
    assert code == 1
    checks = doc["nodes"]["node1"]["checks"]
    assert checks["python"]["status"] == "fail" and "node1: the probe printed no JSON" in checks["python"]["detail"]
    assert checks["clock"]["status"] == "fail" and "node agent did not start" in checks["clock"]["detail"]
    assert checks["ssh"]["status"] == "ok" and status(doc, "node0", "torch") == "ok"


def test_hostname_resolving_to_loopback_is_flagged_with_the_fix(lab3, hrmctl):
    node1 = lab3.node("node1")
    node1.set_hostname_loopback(True)
    try:
        code, doc, err = doctor_json(hrmctl, lab3.inventory, "--nodes", "node0,node1")
    finally:
        node1.set_hostname_loopback(False)
    host = doc["nodes"]["node1"]["checks"]["hostname"]
    assert host["status"] == "warn" and "node1 -> 127.0.1.1" in host["detail"] and "gloo would bind loopback" in host["detail"]
    assert "/etc/hosts" in host["fix"] and "GLOO_SOCKET_IFNAME=eth0" in host["fix"]
    assert doc["nodes"]["node1"]["probe"]["hostname_loopback"] is True
    assert status(doc, "node0", "hostname") == "ok"
