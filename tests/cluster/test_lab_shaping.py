"""The lab's own shaping, measured for real: link rate and delay (tc, and netem or NFQUEUE), CPU
limits (cgroup v1 cpuset and cpu) of a node's SSH sessions, and that nothing of them outlives a lab."""

from __future__ import annotations

import json
import re
import statistics
import secrets
import shlex
import subprocess
import sys

import pytest

from lab.nodes import CGROUP_ROOT, STATE_DIR, Lab, _cpu_list, lab_cgroups, remove_stale, write_state

RATE_MBIT = 50.0

RECEIVER = r"""
import json, socket, sys, time
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen(1)
srv.settimeout(20)
print("ready", flush=True)
conn, _ = srv.accept()
conn.settimeout(20)
buf = bytearray(1 << 20)
first = last = None
count = 0
while True:
    k = conn.recv_into(buf)
    if not k:
        break
    last = time.monotonic()
    if first is None:
        first = last  # the clock starts at the first bytes; they are not counted
    else:
        count += k
print(json.dumps({"bytes": count, "seconds": last - first}))
"""

SENDER = r"""
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 512 * 1024)  # little left to drain after the clock
s.connect((sys.argv[1], int(sys.argv[2])))
chunk = b"x" * (256 * 1024)
end = time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    s.sendall(chunk)
s.close()
"""

BUSY = r"""
import json, os, time
w0, c0 = time.perf_counter(), time.process_time()
while time.perf_counter() - w0 < 2.0:
    pass
print(json.dumps({"ratio": (time.process_time() - c0) / (time.perf_counter() - w0),
                  "affinity": sorted(os.sched_getaffinity(0))}))
"""


def tcp_mbit(sender, receiver, seconds: float = 2.0) -> float:
    """Mbit/s of one TCP stream from sender to receiver (two lab nodes), measured at the receiver."""
    port = str(20000 + secrets.randbelow(20000))
    recv = subprocess.Popen(["ip", "netns", "exec", receiver.ns, sys.executable, "-c", RECEIVER, receiver.ip, port],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready", recv.stderr.read()
        sender.netns([sys.executable, "-c", SENDER, receiver.ip, port, str(seconds)], timeout=30)
        out, err = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    assert recv.returncode == 0, err
    doc = json.loads(out)
    return doc["bytes"] * 8 / doc["seconds"] / 1e6


def ping_ms(src, dst, count: int = 20) -> float:
    """The shortest round-trip time in ms of `count` pings from node src to node dst, user to user (-U):
    ping's default RTT ends at the reply's kernel receive timestamp, taken before the NFQUEUE delay
    holds it, so a pinging node would not see its own link's delay (applications do). The shortest, not the
    median: a delay can only come late on a busy host (the delayer waits for a core), never early, so the
    shortest round trip is the one that shows the delay the link was given."""
    res = src.netns(["ping", "-U", "-n", "-c", str(count), "-i", "0.02", "-W", "2", dst.ip], timeout=30)
    times = [float(t) for t in re.findall(r"time=([\d.]+) ms", res.stdout)]
    assert len(times) >= count - 1, res.stdout
    return min(times)


def ssh(lab, node, script: str) -> dict:
    """Run a Python script on a node through its real sshd (a fresh session), return its JSON line."""
    argv = ["ssh", "-F", "/dev/null", "-i", str(lab.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=10", f"{node.user}@{node.ip}", "python3 -c " + shlex.quote(script)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def until(measure, good, tries: int = 3) -> list:
    """Measure up to `tries` times, until a result is good: other work on this 2-core machine can
    starve one run (the delayer, or the busy loop), never push one past a limit."""
    results = [measure()]
    while not good(results[-1]) and len(results) < tries:
        results.append(measure())
    return results


def qdiscs(node) -> tuple[str, str]:
    egress = node.netns(["tc", "qdisc", "show", "dev", "eth0"]).stdout
    ingress = subprocess.run(["tc", "qdisc", "show", "dev", node.veth], capture_output=True, text=True,
                             check=True).stdout
    return egress, ingress


@pytest.mark.parametrize("quiet", [False, pytest.param(True, marks=pytest.mark.alone)], ids=["beside", "alone"])
def test_rate_shaping_in_both_directions(lab3, quiet):
    """Beside the other tests: the shaped rate is never exceeded, and the free link stays past four times the shaped
    rate with every core busy (veth between namespaces: no wire). Alone: the shaped rate is also reached within
    three tries; beside the suite's load the delayer (a user-space process where netem cannot delay the ingress)
    and iperf's ends get too little of the 2 cores to reach it (19-25 of 50 Mbit/s on a fresh machine's suite)."""
    a, b = lab3.nodes[0], lab3.nodes[1]
    free_out, free_in = tcp_mbit(b, a), tcp_mbit(a, b)
    try:
        b.shape_link(RATE_MBIT, delay_ms=5)
        egress, ingress = qdiscs(b)
        assert "htb" in egress and "htb" in ingress, (egress, ingress)
        reached = lambda mbit: mbit >= 0.75 * RATE_MBIT  # noqa: E731
        shaped_out = until(lambda: tcp_mbit(b, a), reached)  # b's egress
        shaped_in = until(lambda: tcp_mbit(a, b), reached)  # b's ingress
        mechanism = b.delay_mechanism
    finally:
        b.shape_link(None)
    print(f"\nunshaped {free_out:.0f}/{free_in:.0f} Mbit/s out/in; shape_link({RATE_MBIT:g}, 5) "
          f"{[round(x, 1) for x in shaped_out]}/{[round(x, 1) for x in shaped_in]} Mbit/s (delay by {mechanism})")
    for shaped in (shaped_out, shaped_in):
        assert all(mbit <= 1.25 * RATE_MBIT for mbit in shaped), (shaped_out, shaped_in)
        assert reached(shaped[-1]) or not quiet, (shaped_out, shaped_in)
    assert min(free_out, free_in) > 4 * RATE_MBIT, (free_out, free_in)
    # removed: no qdisc of ours left, and the link is fast again
    egress, ingress = qdiscs(b)
    assert "htb" not in egress + ingress and "netem" not in ingress, (egress, ingress)
    assert "NFQUEUE" not in b.netns(["iptables", "-S", "INPUT"]).stdout and b.delayer is None
    assert tcp_mbit(a, b, seconds=1.0) > 4 * RATE_MBIT


@pytest.mark.alone  # measures rates, delays or CPU shares: nothing else on the cores
def test_delay_adds_its_value_to_the_round_trip_and_replaces(lab3):
    a, b, c = lab3.nodes
    base_ab, base_ba = ping_ms(a, b), ping_ms(b, a)
    try:
        b.shape_link(None, delay_ms=20)
        d20_ab, d20_ba, d20_ac = ping_ms(a, b), ping_ms(b, a), ping_ms(a, c)
        b.shape_link(RATE_MBIT, delay_ms=8)  # replaces the 20 ms: not 28
        d8_ab = ping_ms(a, b)
        a.shape_link(None, delay_ms=4)  # both ends shaped: their delays add up
        both = ping_ms(a, b)
    finally:
        a.shape_link(None)
        b.shape_link(None)
    after = ping_ms(a, b)
    print(f"\nRTT a-b {base_ab:.2f} ms (b-a {base_ba:.2f}); b +20: {d20_ab:.2f} (b-a {d20_ba:.2f}, a-c {d20_ac:.2f}); "
          f"b 50 Mbit +8: {d8_ab:.2f}; and a +4: {both:.2f}; unshaped: {after:.2f}")
    assert 19.5 <= d20_ab - base_ab <= 25, (base_ab, d20_ab)
    assert 19.5 <= d20_ba - base_ba <= 25, (base_ba, d20_ba)  # either side's ping
    assert d20_ac < base_ab + 2  # a path not through b's link is untouched
    assert 7.5 <= d8_ab - base_ab <= 13, (base_ab, d8_ab)  # 8, not 20 + 8
    assert 11.5 <= both - base_ab <= 17, (base_ab, both)  # 8 + 4
    assert after < base_ab + 2, (base_ab, after)


def _pings(src, dst, count: int) -> list[float]:
    res = src.netns(["ping", "-U", "-n", "-c", str(count), "-i", "0.01", "-W", "1", dst.ip], timeout=60, check=False)
    return [float(t) for t in re.findall(r"time=([\d.]+) ms", res.stdout)]


@pytest.mark.alone  # measures delays: nothing else on the cores
def test_jitter_spreads_the_delay_and_loss_drops_its_share_of_packets(lab3):
    """A crowded Wi-Fi: 20 +- 10 ms and 10% of the arriving packets lost (1% is the benchmarks', 10% counts here in
    300 pings: 30 expected, the bounds below four standard deviations away)."""
    a, b = lab3.nodes[:2]
    try:
        b.shape_link(None, delay_ms=20)
        steady = _pings(a, b, 100)
        b.shape_link(None, delay_ms=20, jitter_ms=10, loss=0.1)
        shaky = _pings(a, b, 300)
    finally:
        b.shape_link(None)
    spread = statistics.pstdev
    print(f"\n+20 ms: {len(steady)}/100 back, stdev {spread(steady):.2f} ms; +20 +-10 ms, 10% loss: {len(shaky)}/300 "
          f"back, stdev {spread(shaky):.2f} ms, {min(shaky):.1f}-{max(shaky):.1f} ms")
    assert len(steady) >= 99 and 245 <= len(shaky) <= 290, (len(steady), len(shaky))
    assert spread(shaky) > 2 * spread(steady) and spread(shaky) > 2.0, (spread(steady), spread(shaky))
    assert min(shaky) >= 9 and 15 <= statistics.median(shaky) <= 30, sorted(shaky)
    assert b.delayer is None and "NFQUEUE" not in b.netns(["iptables", "-S", "INPUT"]).stdout


@pytest.mark.alone  # measures rates, delays or CPU shares: nothing else on the cores
def test_cpu_limit_reaches_every_ssh_session(lab3):
    node = lab3.nodes[1]
    try:
        node.limit_cpu(cpus="0", quota=0.5)
        groups = [CGROUP_ROOT / c / f"hrmlab-{lab3.token}-{node.name}" for c in ("cpuset", "cpu")]
        for group in groups:
            assert str(node.sshd.pid) in (group / "cgroup.procs").read_text().split(), group
        limited = until(lambda: ssh(lab3, node, BUSY), lambda r: r["ratio"] >= 0.4)
        node.limit_cpu()
        assert (groups[1] / "cpu.cfs_quota_us").read_text().strip() == "-1"
        lifted = until(lambda: ssh(lab3, node, BUSY), lambda r: r["ratio"] >= 0.85, tries=5)
    finally:
        node.limit_cpu()
    everything = _cpu_list((CGROUP_ROOT / "cpuset" / "cpuset.effective_cpus").read_text())
    print(f"\ncpus=0 quota=0.5: CPU/wall {[round(r['ratio'], 3) for r in limited]} on {limited[-1]['affinity']}; "
          f"lifted: {[round(r['ratio'], 3) for r in lifted]} on {lifted[-1]['affinity']}")
    assert all(r["affinity"] == [0] for r in limited), limited
    assert all(r["ratio"] <= 0.6 for r in limited) and limited[-1]["ratio"] >= 0.4, limited
    assert all(r["affinity"] == everything for r in lifted), lifted
    # the quota held the loop to half a core (<= 0.6 above); lifted, it runs well past that: on a quiet machine a whole
    # core (>= 0.85, which `until` waits for), with the rest of the suite beside it on these 2 cores at least 0.7
    assert max(r["ratio"] for r in lifted) >= 0.7, lifted


def test_pin_cores_pins_node_i_to_core_i(lab3):
    cores = _cpu_list((CGROUP_ROOT / "cpuset" / "cpuset.effective_cpus").read_text())
    try:
        lab3.pin_cores()
        seen = [ssh(lab3, n, "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))")
                for n in lab3.nodes]
    finally:
        for n in lab3.nodes:
            n.limit_cpu()
    assert seen == [[cores[i % len(cores)]] for i in range(len(lab3.nodes))], seen


def _state_of_a_dead_owner(lab: Lab) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_state(lab.token, {"pid": dead.pid, "n": lab.n})


def test_down_and_remove_stale_leave_no_cgroups(make_lab, lab3):
    for teardown in ("down", "remove_stale"):
        lab = Lab(1, python=lab3.python)
        try:
            lab.up()
            node = lab.nodes[0]
            node.limit_cpu(cpus="0", quota=0.5)
            node.shape_link(RATE_MBIT, delay_ms=3)
            ssh(lab, node, "import json; print(json.dumps({}))")  # a session came and went inside
            assert len(lab_cgroups(lab.token)) == 2
            delayer = node.delayer
        finally:
            if teardown == "remove_stale":
                _state_of_a_dead_owner(lab)
                remove_stale()
            lab.down()  # after remove_stale: finds nothing left, and says nothing
        assert lab_cgroups(lab.token) == [], teardown
        assert not list(CGROUP_ROOT.glob(f"*/hrmlab-{lab.token}-*")), teardown
        assert not (STATE_DIR / f"{lab.token}.json").exists()
        assert lab.nodes[0].ns not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                     text=True).stdout
        if delayer is not None:
            assert delayer.poll() is not None
