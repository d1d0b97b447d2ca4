"""The full mesh graded by direction and by what the backend needs (netcheck.network_checks), on made-up
MeshResults: which node's firewall to fix, and whether gloo/NCCL training is affected."""

from __future__ import annotations

from netcheck.node_checks import FAIL, OK, WARN
from netcheck.network_checks import mesh_check, mesh_verdict, needed_directions
from netcheck.ports import MeshResult

IPS = {"node0": "10.1.2.11", "node1": "10.1.2.12", "node2": "10.1.2.13"}
TIMEOUT = ("{s} cannot reach {d} ({ip}):40000 (random high port, as gloo/NCCL use) — timed out: a firewall on {d} "
           "(or one on {s} dropping the replies) blocks it; fix: on {d} allow TCP 40000")


def mesh(nodes, blocked):
    res = MeshResult(addresses={n: IPS[n] for n in nodes})
    for s in nodes:
        for d in nodes:
            if s != d:
                res.pairs[(s, d)] = TIMEOUT.format(s=s, d=d, ip=IPS[d]) if (s, d) in blocked else None
                res.ms[(s, d)] = None if (s, d) in blocked else 0.2
    return res


def checks(v, nodes):
    return {n: mesh_check(n, v) for n in nodes}


def test_gloo_dials_from_the_higher_address_nccl_needs_both():
    assert needed_directions("node0", "node1", IPS, "gloo") == {("node1", "node0")}
    assert needed_directions("node2", "node0", IPS, "gloo") == {("node2", "node0")}
    assert needed_directions("node0", "node1", IPS, "nccl") == {("node0", "node1"), ("node1", "node0")}
    # numeric, not textual, order: .9 < .10
    assert needed_directions("a", "b", {"a": "10.0.0.9", "b": "10.0.0.10"}, "gloo") == {("b", "a")}
    assert needed_directions("a", "b", {"a": "10.0.0.9", "b": "host"}, "gloo") == {("a", "b"), ("b", "a")}


def test_healthy_mesh_is_ok_everywhere():
    nodes = ["node0", "node1", "node2"]
    v = mesh_verdict(mesh(nodes, set()), "gloo")
    assert not v.training_affected and not v.closed_inbound
    assert all(c.status == OK for c in checks(v, nodes).values())
    assert len(v.directions) == 6 and sum(d["needed"] for d in v.directions) == 3


def test_node_refusing_inbound_two_nodes_warns_naming_it_and_training_not_affected():
    nodes = ["node0", "node1"]
    v = mesh_verdict(mesh(nodes, {("node0", "node1")}), "gloo", {"node1": {"kind": "linux"}})
    assert v.closed_inbound == ["node1"] and not v.closed_outbound and not v.training_affected
    c = checks(v, nodes)
    assert c["node1"].status == WARN and "node1 accepts no inbound TCP on high ports" in c["node1"].detail
    assert "training with gloo is not affected (gloo dials node1 -> node0" in c["node1"].detail
    assert c["node1"].fix.startswith("on node1: `sudo ufw allow proto tcp from 10.1.2.0/24 to any port 1024:65535`")
    assert c["node0"].status == WARN and "cannot reach node1 (node1's firewall)" in c["node0"].detail
    assert "on node0" not in c["node0"].fix and c["node0"].fix.startswith("on node1: open its firewall")
    assert v.fixes == {"node1": c["node1"].fix}
    assert [d["ok"] for d in v.directions] == [False, True]
    # the same cluster on NCCL: the direction is needed
    n = mesh_verdict(mesh(nodes, {("node0", "node1")}), "nccl")
    assert n.training_affected and mesh_check("node1", n).status == FAIL
    assert "nccl needs node0 -> node1" in mesh_check("node1", n).detail


def test_node_refusing_inbound_among_three_fails_where_gloo_dials_it():
    nodes = ["node0", "node1", "node2"]
    v = mesh_verdict(mesh(nodes, {("node0", "node1"), ("node2", "node1")}), "gloo")
    assert v.closed_inbound == ["node1"] and v.training_affected
    c = checks(v, nodes)
    assert c["node1"].status == FAIL and "gloo needs node2 -> node1: training hangs" in c["node1"].detail
    assert c["node2"].status == FAIL and c["node0"].status == WARN  # node0 -> node1 is never dialled
    assert all(ch.fix.startswith("on node1:") for ch in (c["node0"], c["node1"], c["node2"]))


def test_pair_blocked_both_ways_fails():
    nodes = ["node0", "node1", "node2"]
    v = mesh_verdict(mesh(nodes, {("node1", "node2"), ("node2", "node1")}), "gloo")
    assert v.dead_pairs() == [("node1", "node2")] and v.training_affected and not v.closed_inbound
    c = checks(v, nodes)
    assert c["node1"].status == FAIL and "no direction works with node2" in c["node1"].detail
    assert c["node0"].status == OK
    assert "on node1:" in c["node1"].fix  # gloo's direction node2 -> node1 lands on node1


def test_windows_and_wsl_fixes():
    nodes = ["node0", "node1"]
    for kind, want in (("wsl2", "Set-NetFirewallHyperVVMSetting"), ("windows", "New-NetFirewallRule")):
        v = mesh_verdict(mesh(nodes, {("node0", "node1")}), "gloo", {"node1": {"kind": kind}})
        fix = mesh_check("node1", v).fix
        assert want in fix and "-RemoteAddress 10.1.2.0/24" in fix and "-Direction Inbound" in fix


def test_node_that_reaches_no_one_is_blamed_for_its_outbound():
    nodes = ["node0", "node1", "node2"]
    v = mesh_verdict(mesh(nodes, {("node2", "node0"), ("node2", "node1")}), "gloo")
    assert v.closed_outbound == ["node2"] and not v.closed_inbound
    c = mesh_check("node2", v)
    assert c.status == FAIL and "node2 opens no outbound TCP" in c.detail and c.fix.startswith("on node2:")
