"""netcheck's parsing and pure checks, fed with faked /proc contents and outputs.

WSL and native Windows cannot run here: these fakes of /proc/sys/kernel/osrelease, /proc/version,
wslinfo and resolv.conf are the mock for them (the strings are what those systems print).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from netcheck.backend import choose_backend
from netcheck.node_checks import FAIL, OK, SKIP, WARN, os_check
from netcheck.consistency_checks import cluster_checks
from netcheck.network_checks import clock_check, rtt_check
from netcheck.clock import ClockSkew, best_offset
from netcheck.node_probe_client import ProbeError, parse_probe
from node.probe import os_kind, parse_ip_addr, wsl_networking
from netcheck.rtt import parse_ping

WSL2_REL = "5.15.153.1-microsoft-standard-WSL2"
WSL1_REL = "4.4.0-19041-Microsoft"
WSL1_VER = "Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com) (gcc version 5.4.0 (GCC) ) #1237-Microsoft"


@pytest.mark.parametrize("system,version,rel,interop,kind", [
    ("Linux", "Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org)", "6.1.0-18-amd64", False, "linux"),
    ("Linux", "Linux version 5.15.153.1-microsoft-standard-WSL2 (root@...)", WSL2_REL, True, "wsl2"),
    ("Linux", WSL1_VER, WSL1_REL, True, "wsl1"),
    ("Windows", "", "", False, "windows"),
    ("Darwin", "", "", False, "macos"),
])
def test_os_kind(system, version, rel, interop, kind):
    assert os_kind(system, version, rel, interop) == kind


def test_wsl_networking_modes():
    eth0_nat = {"lo": ["127.0.0.1"], "eth0": ["172.24.113.5"]}
    eth0_lan = {"lo": ["127.0.0.1"], "eth0": ["192.168.1.23"], "loopback0": []}
    assert wsl_networking("mirrored\n", "", eth0_nat) == "mirrored"       # wslinfo wins
    assert wsl_networking("nat\n", "", eth0_lan) == "nat"
    assert wsl_networking(None, "nameserver 10.255.255.254\n", {"eth0": ["192.168.1.23"]}) == "mirrored"
    assert wsl_networking(None, "nameserver 172.24.112.1\n", eth0_lan) == "mirrored"  # loopback0
    assert wsl_networking(None, "nameserver 172.24.112.1\n", eth0_nat) == "nat"
    assert wsl_networking(None, "", {"eth0": ["192.168.1.23"]}) == "unknown"


class FakeProbe:
    def __init__(self, **kw):
        self.os_kind = kw.get("os_kind", "linux")
        self.wsl_networking = kw.get("wsl_networking")
        self.torch_version = kw.get("torch_version", "2.13.0")
        self.cuda_devices = kw.get("cuda_devices", 0)
        self.nccl = kw.get("nccl", False)
        self.raw = kw.get("raw", {"os": {"distro": "Ubuntu 22.04"}})

    @property
    def nccl_usable(self):
        return self.nccl and self.cuda_devices > 0


def test_wsl2_nat_fails_with_the_wslconfig_fix_only_when_multi_node():
    p = FakeProbe(os_kind="wsl2", wsl_networking="nat")
    multi = os_check(p, multi=True)
    assert multi.status == FAIL and "networkingMode=mirrored" in multi.fix and ".wslconfig" in multi.fix
    assert "Firewall" in multi.fix or "firewall" in multi.fix.lower()
    assert os_check(p, multi=False).status == OK
    assert os_check(FakeProbe(os_kind="wsl2", wsl_networking="mirrored"), multi=True).status == OK
    assert os_check(FakeProbe(os_kind="wsl1"), multi=True).status == FAIL
    win = os_check(FakeProbe(os_kind="windows"), multi=True)
    assert win.status == WARN and "WSL2" in win.fix


def test_parse_ip_addr():
    text = ("1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n"
            "2: eth0    inet 10.1.2.11/24 brd 10.1.2.255 scope global eth0\n"
            "2: eth0    inet6 fe80::1/64 scope link\n"
            "5: wlp2s0@if3    inet 192.168.1.5/24 scope global dynamic wlp2s0\n")
    assert parse_ip_addr(text) == {"lo": ["127.0.0.1"], "eth0": ["10.1.2.11", "fe80::1"], "wlp2s0": ["192.168.1.5"]}


def test_parse_ping_iputils_and_busybox_and_total_loss():
    iputils = ("--- 10.1.2.12 ping statistics ---\n10 packets transmitted, 8 received, 20% packet loss, time 460ms\n"
               "rtt min/avg/max/mdev = 80.1/81.5/90.2/1.1 ms\n")
    r = parse_ping(iputils)
    assert (r["sent"], r["received"], r["loss_pct"], r["avg_ms"]) == (10, 8, 20.0, 81.5)
    busy = "5 packets transmitted, 5 packets received, 0% packet loss\nround-trip min/avg/max = 0.1/0.2/0.4 ms\n"
    assert parse_ping(busy)["min_ms"] == 0.1
    dead = parse_ping("3 packets transmitted, 0 received, 100% packet loss, time 2030ms\n")
    assert dead["received"] == 0 and dead["avg_ms"] is None
    assert rtt_check("reach", "from here", dead).status == FAIL
    assert parse_ping("ping: socket: Operation not permitted") is None


def test_rtt_thresholds():
    base = {"method": "ping", "sent": 10, "min_ms": 0.1, "max_ms": 1.0}
    assert rtt_check("reach", "x", {**base, "received": 10, "loss_pct": 0.0, "avg_ms": 0.5}).status == OK
    assert rtt_check("reach", "x", {**base, "received": 10, "loss_pct": 0.0, "avg_ms": 80.0}).status == WARN
    assert rtt_check("reach", "x", {**base, "received": 5, "loss_pct": 50.0, "avg_ms": 1.0}).status == FAIL


def test_cristian_picks_the_shortest_round_trip():
    # node is 5 s ahead; the slow samples carry large asymmetric delays
    samples = [(100.0, 105.300, 100.400), (200.0, 205.0101, 200.0202), (300.0, 305.9, 301.0)]
    skew = best_offset(samples)
    assert skew.offset_ms == pytest.approx(5000.0, abs=0.01) and skew.error_ms == pytest.approx(10.1, abs=0.01)
    assert clock_check(skew).status == FAIL
    assert clock_check(ClockSkew(400.0, 1.0, 8)).status == WARN
    assert clock_check(ClockSkew(-3.0, 1.0, 8)).status == OK


def test_backend_and_consistency():
    gpu = FakeProbe(cuda_devices=1, nccl=True, raw={"project": {"commit": "a" * 40}, "data": {"datasets": {"sudoku": "x"}}})
    cpu = FakeProbe(torch_version="2.12.1", raw={"project": {"commit": "b" * 40}, "data": {"datasets": {"sudoku": "y"}}})
    assert choose_backend({"n0": gpu, "n1": gpu}) == ("nccl", "every node has CUDA and NCCL")
    backend, why = choose_backend({"n0": gpu, "n1": cpu})
    assert backend == "gloo" and "n1 has no CUDA device" in why
    checks = {c.name: c for c in cluster_checks({"n0": gpu, "n1": cpu})}
    assert checks["torch versions"].status == FAIL and "2.12 on n1" in checks["torch versions"].detail
    assert checks["project commit"].status == WARN
    assert checks["dataset"].status == FAIL and "`hrmctl sync-data n1`" in checks["dataset"].fix


def test_the_dataset_check_reads_what_prepare_data_writes(tmp_path):
    """issue 33, item 7: the probe looked for manifest.json, prepare-data writes meta.json: the check never fired.
    Real data directories made by prepare-data (sudoku), one changed on the second node, one missing on the third."""
    import shutil

    from netcheck.consistency_checks import dataset_check
    from node.probe import disk_facts
    from tests.trainer.helpers import prepare_data

    roots = [tmp_path / f"n{i}" for i in range(3)]
    assert prepare_data(["--task", "sudoku", "--out", str(roots[0] / "sudoku"), "--train", "20", "--test", "5"]) == 0
    shutil.copytree(roots[0] / "sudoku", roots[1] / "sudoku")
    shutil.copytree(roots[0] / "sudoku", roots[2] / "sudoku")
    held = {f"n{i}": disk_facts(str(r))["datasets"] for i, r in enumerate(roots)}
    assert set(held["n0"]) == {"sudoku"} and held["n0"] == held["n1"] == held["n2"]
    assert dataset_check(held).status == OK
    assert disk_facts(str(roots[0] / "sudoku"))["datasets"].keys() == {"."}  # data_dir itself a data directory
    # n1's data made again with other options: another meta.json
    assert prepare_data(["--task", "sudoku", "--out", str(roots[1] / "sudoku"), "--train", "21", "--test", "5"]) == 0
    held["n1"] = disk_facts(str(roots[1]))["datasets"]
    check = dataset_check(held)
    assert check.status == FAIL and "sudoku: " in check.detail and "on n1" in check.detail, check
    assert check.fix == "bring n1 to match n0: `hrmctl sync-data n1`", check.fix
    held["n1"] = held["n0"]
    held["n2"] = {}
    check = dataset_check(held)
    assert check.status == WARN and "sudoku on n2" in check.detail and "`hrmctl sync-data n2`" in check.fix, check
    assert dataset_check({"n0": {}, "n1": {}}).status == SKIP


def test_garbage_probe_answers_are_probe_errors():
    for out in ("", "Traceback (most recent call last):\n  boom", "{not json", '{"x": 1}'):
        with pytest.raises(ProbeError, match="^n1: "):
            parse_probe("n1", out)


def test_probe_runs_as_a_script_without_the_project(tmp_path):
    """The probe's bootstrap alone, through stdin, from an unrelated directory: one JSON object."""
    from node.ship import program
    res = subprocess.run([sys.executable, "-I", "-", "--no-torch", "--route-to", "127.0.0.1", "--data-dir",
                          str(tmp_path / "nope")], input=program("probe"), capture_output=True, text=True,
                         cwd=tmp_path, timeout=30)
    doc = json.loads(res.stdout)
    assert doc["probe_version"] == 1 and doc["torch"] is None
    assert doc["route"]["ifname"] == "lo" and doc["data"]["exists"] is False and doc["data"]["free_gb"] > 0
    p = parse_probe("local", res.stdout)
    assert p.torch_version is None and p.route_src == "127.0.0.1"


def test_peer_rtt_is_not_lengthened_by_the_probes_own_work():
    """The probe times TCP connects to the master while it imports torch. Measured from a thread,
    each connect's end waited for the GIL: 0.1 ms of loopback read as tens of ms. Here the main
    thread holds the GIL in long C calls (sorts of 2 million floats) the whole time. The bound is the shortest of
    those holds, measured here: a connect timed from a thread waits for the GIL half a hold on average."""
    import random
    import socket
    import time

    from node.probe import tcp_rtt_aside

    server = socket.create_server(("127.0.0.1", 0), backlog=16)
    holds = []
    try:
        wait = tcp_rtt_aside("127.0.0.1", server.getsockname()[1], 5)
        floats = [random.random() for _ in range(2_000_000)]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.6:
            t1 = time.perf_counter()
            sorted(floats)
            holds.append((time.perf_counter() - t1) * 1000)
        rtt = wait(60.0)  # the child's five connects: generous for a loaded machine, it only bounds a hang
    finally:
        server.close()
    assert rtt is not None and rtt["received"] == 5, rtt
    assert rtt["avg_ms"] < min(holds) / 5, (rtt, holds)
