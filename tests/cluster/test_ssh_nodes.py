"""The ground, on real sshd nodes: inventory, parallel execution, host keys, auth, unreachable."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from cli.errors import AuthError, HostKeyError, UnreachableError
from cli.nodes.inventory import load_inventory
from cli.nodes.remote import connect, for_each


def test_nodes_json_against_the_lab(lab3, hrmctl):
    code, out, err = hrmctl("nodes", "--json", "--check", inventory=lab3.inventory)
    assert code == 0, err
    doc = json.loads(out)
    assert [n["name"] for n in doc["nodes"]] == ["node0", "node1", "node2"]
    assert doc["master"] == "node0"
    for n, lab_node in zip(doc["nodes"], lab3.nodes):
        assert n["host"] == lab_node.ip
        assert n["sources"]["host"] == "inventory" and n["sources"]["python"] == "defaults"
        assert n["check"]["ok"], n["check"]
        # each node answers with its own hostname (its UTS namespace), through its own sshd
        assert n["check"]["hostname"] == lab_node.name


def test_command_on_three_nodes_in_parallel(lab3):
    nodes = load_inventory(lab3.inventory).select(None)
    command = ["sh", "-c", "sleep 1; id -un; hostname"]
    t0 = time.monotonic()
    assert for_each(nodes[:1], lambda s: s.run(command, timeout=20))[0].ok
    one = time.monotonic() - t0  # the baseline on this machine, now: one node's connection and its 1 s command
    t0 = time.monotonic()
    outs = for_each(nodes, lambda s: s.run(command, timeout=20))
    elapsed = time.monotonic() - t0
    assert all(o.ok for o in outs), [o.error for o in outs]
    assert [o.value.stdout.split() for o in outs] == [[n.user, n.name] for n in lab3.nodes]
    # one after another they would take three times the baseline; side by side about one, whatever this machine's
    # speed (the three handshakes share its two cores: 2.5 leaves room for that)
    assert elapsed < 2.5 * one, f"three 1 s commands took {elapsed:.1f}s, one alone {one:.1f}s: not parallel"


def test_quoting_survives_hostile_arguments(lab3):
    node = load_inventory(lab3.inventory).select("node1")[0]
    weird = "a b'c\"d;$(touch /tmp/pwned-hrmctl)`x`\n"
    with connect(node) as s:
        res = s.run(["printf", "%s", weird], timeout=10)
        home = s.run(["sh", "-c", 'echo "$HOME"'], timeout=10).stdout.strip()
        tilde = s.run(["ls", "-d", "~/hrmctl"], timeout=10)
    assert res.stdout == weird
    assert tilde.stdout.strip() == f"{home}/hrmctl"
    assert not __import__("os").path.exists("/tmp/pwned-hrmctl")


def test_run_python_and_copy_files(lab3, tmp_path):
    node = load_inventory(lab3.inventory).select("node2")[0]
    src = tmp_path / "file with space.txt"
    src.write_bytes(b"payload\x00\xff" * 1000)
    with connect(node) as s:
        res = s.run_python("import sys, socket; print(socket.gethostname(), sys.argv[1])", ["arg one"])
        s.put(src, "~/copied file")
        s.get("~/copied file", tmp_path / "back")
    assert res.ok and res.stdout.split() == ["node2", "arg", "one"]
    assert (tmp_path / "back").read_bytes() == src.read_bytes()


def test_a_command_that_ends_before_taking_its_input_reports_its_exit(lab3):
    """A missing python ends at once; the probe's source still on its way must not turn that into
    "Socket is closed" (seen when the cluster tier ran on a loaded machine)."""
    node = load_inventory(lab3.inventory).select("node1")[0]
    with connect(node) as s:
        res = s.run(["/nope/python3", "-"], input="pass\n" * 2_000_000, timeout=20)  # 10 MB: more than a window
        assert s.run(["true"], timeout=10).ok  # the connection is still good
    assert res.code == 127 and "No such file" in res.stderr


def test_unknown_host_key_refused_then_accepted(lab3, hrmctl, tmp_path):
    inv = tmp_path / "hrmctl.toml"
    kh = tmp_path / "known_hosts"
    inv.write_text(lab3.inventory.read_text().replace(str(lab3.known_hosts), str(kh)))
    code, out, err = hrmctl("nodes", "--check", "--nodes", "node0", inventory=inv)
    assert code == 1
    assert "unknown host key" in out and "ssh-keyscan" in out and "--accept-new-host-keys" in out
    assert not kh.exists() or lab3.nodes[0].ip not in kh.read_text()
    code, out, err = hrmctl("nodes", "--check", "--nodes", "node0", "--accept-new-host-keys", inventory=inv)
    assert code == 0, out + err
    assert lab3.nodes[0].host_key_line.split()[2] in kh.read_text()
    code, out, err = hrmctl("nodes", "--check", "--nodes", "node0", inventory=inv)  # now known
    assert code == 0, out + err


def test_changed_host_key_refused_loudly(lab3, tmp_path):
    kh = tmp_path / "known_hosts"
    shutil.copy(lab3.known_hosts, kh)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()
    ip = lab3.nodes[1].ip
    kh.write_text("".join(l if not l.startswith(ip + " ") else f"{ip} {other[0]} {other[1]}\n"
                          for l in kh.read_text().splitlines(keepends=True)))
    node = load_inventory(lab3.inventory).select("node1")[0]
    node.known_hosts = [str(kh)]
    for accept in (False, True):  # --accept-new-host-keys never accepts a changed key
        with pytest.raises(HostKeyError, match="HOST KEY CHANGED.*ssh-keygen -R"):
            connect(node, accept_new_host_keys=accept)
    assert f"{ip} {other[0]} {other[1]}" in kh.read_text()


def test_wrong_key_is_one_auth_error_line(lab3, hrmctl, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "wrong")], check=True)
    inv = tmp_path / "hrmctl.toml"
    inv.write_text(lab3.inventory.read_text().replace(f'identity_file = "{lab3.key}"',
                                                      f'identity_file = "{tmp_path / "wrong"}"'))
    code, out, err = hrmctl("nodes", "--check", "--nodes", "node2", inventory=inv)
    assert code == 1
    fails = [l for l in out.splitlines() if l.startswith("fail")]
    assert len(fails) == 1 and "authentication failed" in fails[0] and "ssh-copy-id" in fails[0]
    assert "Traceback" not in out + err
    node = load_inventory(inv).select("node2")[0]
    with pytest.raises(AuthError):
        connect(node)


def test_unreachable_node_fails_in_bounded_time_others_answer(lab3):
    victim = lab3.nodes[2]
    victim.netns(["iptables", "-I", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"])
    try:
        nodes = load_inventory(lab3.inventory).select(None)
        t0 = time.monotonic()
        assert all(o.ok for o in for_each(nodes[:2], lambda s: s.run(["hostname"], timeout=10), connect_timeout=3))
        healthy = time.monotonic() - t0  # the baseline on this machine, now: the two healthy nodes alone
        t0 = time.monotonic()
        outs = for_each(nodes, lambda s: s.run(["hostname"], timeout=10), connect_timeout=3)
        elapsed = time.monotonic() - t0
        with pytest.raises(UnreachableError):
            connect(nodes[2], timeout=1)
    finally:
        victim.netns(["iptables", "-D", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"])
    assert [o.ok for o in outs] == [True, True, False]
    assert [o.value.stdout.strip() for o in outs[:2]] == ["node0", "node1"]
    assert "node2" in outs[2].error and "within 3s" in outs[2].error
    # the down node costs its 3 s connect timeout, beside the others (no hang: a SYN unanswered retries for minutes);
    # twice the healthy nodes' own time and 2 s leave room for this machine's load
    assert elapsed < 3 + 2 * healthy + 2, \
        f"an unreachable node held the others for {elapsed:.1f}s (the healthy nodes alone: {healthy:.1f}s)"
