"""`hrmctl doctor` on real sshd nodes, each fault made for real inside a node's namespace."""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import contextmanager

from tests.lab import ROOT, SYSTEM_PYTHON
from tests.nfq_delay import delayed_inbound

# These checks are about the node itself or the network; "project" depends on the tree the lab copied.
NETWORK_ROWS = ("ssh", "os", "python", "torch", "nccl/gloo", "libuv", "interface", "hostname", "reach", "clock",
                "master port", "mesh")


def doctor_json(hrmctl, inventory, *args, timeout=120):
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
        assert abs(doc["nodes"][lab_node.name]["clock"]["offset_ms"]) < 50
    cluster = doc["cluster"]
    assert cluster["torch versions"]["status"] == "ok" and cluster["backend"]["detail"].startswith("gloo")
    assert doc["summary"]["fail"] == 0 and doc["exit_code"] == 0


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
        code, out, err = hrmctl("doctor", "--master-port", "29500", inventory=lab3.inventory, timeout=120)
    assert code == 1, out + err
    assert f"node1 cannot reach node0 ({node0.ip}):29500" in out
    fails = [l for l in out.splitlines() if l.startswith("fail")]
    assert len(fails) == 1 and "node1 · master port" in fails[0], out
    after = out.split(fails[0], 1)[1].splitlines()[1]
    assert after.strip().startswith("fix:") and "allow TCP 29500" in after
    assert "not ready" in out.splitlines()[-1]


def test_firewall_passing_rendezvous_but_not_high_ports_fails_the_mesh(lab3, hrmctl):
    node0, node1 = lab3.node("node0"), lab3.node("node1")
    # node0 lets node1 reach ssh and the master port, but drops every other port from node1
    with iptables(node0, "INPUT", "-p", "tcp", "-s", node1.ip, "-m", "multiport", "!", "--dports", "22,29500",
                  "-j", "DROP"):
        code, doc, err = doctor_json(hrmctl, lab3.inventory)
    assert code == 1
    assert status(doc, "node1", "master port") == "ok"
    assert status(doc, "node0", "mesh") == "fail" and status(doc, "node1", "mesh") == "fail"
    assert "not reachable from node1" in doc["nodes"]["node0"]["checks"]["mesh"]["detail"]
    assert "cannot reach node0" in doc["nodes"]["node1"]["checks"]["mesh"]["detail"]
    assert "ip_local_port_range" in doc["nodes"]["node0"]["checks"]["mesh"]["fix"]
    assert status(doc, "node2", "mesh") == "ok"  # only the node0 <- node1 direction is blocked


def test_clock_shifted_5s_is_reported_within_50ms(lab3, hrmctl):
    node1 = lab3.node("node1")
    node1.shift_clock(5.0)  # libfaketime in the node's SSH sessions
    try:
        code, doc, err = doctor_json(hrmctl, lab3.inventory)
    finally:
        node1.shift_clock(None)
    clock = doc["nodes"]["node1"]["clock"]
    assert abs(clock["offset_ms"] - 5000) <= 50, clock
    assert status(doc, "node1", "clock") == "fail" and "timedatectl" in doc["nodes"]["node1"]["checks"]["clock"]["fix"]
    for other in ("node0", "node2"):
        assert abs(doc["nodes"][other]["clock"]["offset_ms"]) < 50 and status(doc, other, "clock") == "ok"
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


def test_down_node_fails_in_bounded_time_while_others_report(lab3, hrmctl):
    node2 = lab3.node("node2")
    with iptables(node2, "INPUT", "-i", "eth0", "-j", "DROP"):  # node2 answers nothing at all
        t0 = time.monotonic()
        code, doc, err = doctor_json(hrmctl, lab3.inventory, "--timeout", "4")
        elapsed = time.monotonic() - t0
    assert code == 1
    assert elapsed < 15, f"a down node held doctor for {elapsed:.1f}s"
    down = doc["nodes"]["node2"]["checks"]
    assert down["ssh"]["status"] == "fail" and "within 4s" in down["ssh"]["detail"]
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
    code, doc, err = doctor_json(hrmctl, inv, "--nodes", "node0,node1", "--timeout", "10")
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
