"""`hrmctl sync-data` against real sshd nodes: only changes go, atomically, verified, resumable."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PART = ".hrmctl-part"


def make_source(root: Path) -> Path:
    (root / "shards").mkdir(parents=True)
    (root / "dir with space" / "deep").mkdir(parents=True)
    (root / "shards" / "train-000.bin").write_bytes(os.urandom(2_000_000))
    (root / "shards" / "val-000.bin").write_bytes(os.urandom(300_000))
    (root / "dir with space" / "it's a \"quoted\" name.txt").write_text("quotes and spaces\n")
    (root / "dir with space" / "deep" / "meta.json").write_text('{"tokens": 123}\n')
    (root / "empty.txt").write_bytes(b"")
    for i in range(20):
        (root / "shards" / f"small-{i:02d}.txt").write_text(f"line {i}\n" * (i + 1))
    (root / "link-inside").symlink_to("shards/val-000.bin")       # read through: stays inside
    (root / "link-outside").symlink_to("/etc/hostname")            # not followed out of the source
    return root


def one_file_source(tmp_path: Path, name: str, size: int) -> Path:
    src = tmp_path / "data"
    src.mkdir()
    (src / name).write_bytes(os.urandom(size))
    return src


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """relpath -> (sha256, mtime_ns) of every regular file (symlinks read through)."""
    out = {}
    for top, _, names in os.walk(root):
        for name in names:
            p = Path(top, name)
            rel = str(p.relative_to(root))
            if p.is_symlink() and not os.path.realpath(p).startswith(str(root.resolve()) + "/"):
                continue
            out[rel] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
    return out


def node_dir(lab, node: str, name: str) -> Path:
    return lab.node(node).home / name


def sync(hrmctl, lab, *args):
    code, out, err = hrmctl("sync-data", *args, "--json", inventory=lab.inventory)
    assert "Traceback" not in out + err
    return code, (json.loads(out) if out.strip().startswith("{") else None), err


def node_of(doc: dict, name: str) -> dict:
    return next(n for n in doc["nodes"] if n["node"] == name)


def test_first_sync_noop_and_one_change_on_two_nodes(lab3, hrmctl, tmp_path):
    src = make_source(tmp_path / "data")
    code, doc, err = sync(hrmctl, lab3, "--nodes", "node1,node2", "--src", str(src), "--dest", "~/sync first")
    assert code == 0, err
    expected = tree(src)
    assert "link-outside" not in expected and "link-inside" in expected
    assert ["link-outside", "a symlink to /etc/hostname, outside the source (not followed)"] in doc["skipped"]
    for name in ("node1", "node2"):
        n = node_of(doc, name)
        assert n["ok"] and n["sent_files"] == len(expected) == n["files"]
        assert n["sent_bytes"] == sum(f.stat().st_size for f in src.rglob("*") if f.is_file()
                                      and f.name != "link-outside")
        dest = node_dir(lab3, name, "sync first")
        assert tree(dest) == expected                      # same bytes, same mtimes
        assert not list(dest.rglob("*" + PART))
        assert not (dest / "link-outside").exists()
        assert n["dest"] == str(dest)

    inodes = {p: p.stat().st_ino for p in node_dir(lab3, "node1", "sync first").rglob("*")}
    code, doc, err = sync(hrmctl, lab3, "node1", "--src", str(src), "--dest", "~/sync first")
    n = node_of(doc, "node1")
    assert code == 0 and n["sent_files"] == 0 and n["sent_bytes"] == 0 and n["unchanged"] == len(expected)
    assert {p: p.stat().st_ino for p in node_dir(lab3, "node1", "sync first").rglob("*")} == inodes

    changed = src / "shards" / "small-03.txt"
    changed.write_text("changed, and longer than before\n")
    code, doc, err = sync(hrmctl, lab3, "node1", "--src", str(src), "--dest", "~/sync first")
    n = node_of(doc, "node1")
    assert code == 0 and n["to_send"] == ["shards/small-03.txt"] and n["sent_bytes"] == changed.stat().st_size
    assert tree(node_dir(lab3, "node1", "sync first")) == tree(src)


def test_dry_run_changes_nothing_and_delete_removes_extras(lab3, hrmctl, tmp_path):
    src = make_source(tmp_path / "data")
    assert sync(hrmctl, lab3, "node2", "--src", str(src), "--dest", "~/sync-delete")[0] == 0
    dest = node_dir(lab3, "node2", "sync-delete")
    (src / "shards" / "val-000.bin").unlink()
    (src / "link-inside").unlink()
    (src / "new.txt").write_text("new\n")
    code, out, err = hrmctl("sync-data", "node2", "--src", str(src), "--dest", "~/sync-delete", "--delete",
                            "--dry-run", inventory=lab3.inventory)
    assert code == 0, err
    assert "send    new.txt" in out and "delete  shards/val-000.bin" in out and "delete  link-inside" in out
    assert not (dest / "new.txt").exists() and (dest / "shards" / "val-000.bin").exists()

    code, doc, err = sync(hrmctl, lab3, "node2", "--src", str(src), "--dest", "~/sync-delete")
    assert code == 0 and (dest / "new.txt").exists() and (dest / "shards" / "val-000.bin").exists()  # kept
    code, doc, err = sync(hrmctl, lab3, "node2", "--src", str(src), "--dest", "~/sync-delete", "--delete")
    assert code == 0, err
    assert sorted(node_of(doc, "node2")["deleted"]) == ["link-inside", "shards/val-000.bin"]
    assert tree(dest) == tree(src)


def _wait_for_part(path: Path, at_least: int, proc: subprocess.Popen, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.stat().st_size >= at_least:
            return
        time.sleep(0.05)
    raise AssertionError(f"the transfer never reached {at_least} bytes in {path} (exit {proc.poll()})")


@contextlib.contextmanager
def slow_link(node):
    """Throttle what the node sends (its ACKs) so that a transfer to it takes seconds."""
    node.netns(["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "50kbit", "burst", "2k",
                "latency", "100ms"])
    try:
        yield
    finally:
        node.netns(["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)


def start_sync(lab, tmp_path, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "sync-data", *args], cwd=tmp_path,
                            env=dict(os.environ, HRMCTL_INVENTORY=str(lab.inventory)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_killed_sync_resumes_the_partly_sent_file(lab3, hrmctl, tmp_path):
    src = one_file_source(tmp_path, "big shard.bin", 4_000_000)
    big = src / "big shard.bin"
    (src / "other.txt").write_text("x\n")
    node = lab3.node("node1")
    dest = node.home / "sync-resume"
    part = dest / f".big shard.bin{PART}"
    with slow_link(node):  # the file is still in flight when the client is killed
        proc = start_sync(lab3, tmp_path, "node1", "--src", str(src), "--dest", "~/sync-resume", "--json")
        _wait_for_part(part, 1_000_000, proc)
        proc.send_signal(signal.SIGKILL)                    # the connection dies with it
        proc.communicate(timeout=30)
    assert not (dest / "big shard.bin").exists()             # never a half file under the final name
    kept = part.stat().st_size
    assert 0 < kept < big.stat().st_size

    code, doc, err = sync(hrmctl, lab3, "node1", "--src", str(src), "--dest", "~/sync-resume")
    n = node_of(doc, "node1")
    assert code == 0, err
    assert n["resumed_bytes"] >= 1_000_000
    assert n["sent_bytes"] < big.stat().st_size + 2       # less than the whole file went again
    assert tree(dest) == tree(src)
    assert not list(dest.rglob("*" + PART))


def test_tampered_partial_file_is_not_resumed(lab3, hrmctl, tmp_path):
    src = one_file_source(tmp_path, "f.bin", 500_000)
    node = lab3.node("node2")
    dest = node.home / "sync-tampered"
    dest.mkdir()
    part = dest / f".f.bin{PART}"
    part.write_bytes(b"\0" * 200_000)                     # a prefix that is not the file's
    subprocess.run(["chown", "-R", f"{node.user}:{node.user}", str(dest)], check=True)
    code, doc, err = sync(hrmctl, lab3, "node2", "--src", str(src), "--dest", "~/sync-tampered")
    n = node_of(doc, "node2")
    assert code == 0 and n["resumed_bytes"] == 0 and n["sent_bytes"] == 500_000
    assert tree(dest) == tree(src) and not part.exists()


def test_stalled_link_is_reported_then_the_rerun_completes(lab3, hrmctl, tmp_path):
    src = one_file_source(tmp_path, "big.bin", 3_000_000)
    node = lab3.node("node2")
    dest = node.home / "sync-stall"
    part = dest / f".big.bin{PART}"
    drop = ["iptables", "-I", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"]
    with slow_link(node):
        try:
            proc = start_sync(lab3, tmp_path, "node2", "--src", str(src), "--dest", "~/sync-stall",
                              "--stall-timeout", "2")
            _wait_for_part(part, 300_000, proc)
            node.netns(drop)                               # the link goes dead mid-file
            out, err = proc.communicate(timeout=60)        # never a hang
        finally:
            node.netns(["iptables", "-D", *drop[2:]], check=False)
    assert proc.returncode not in (0, None)
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "node2" in errors[0] and "run the same command again" in errors[0], err
    assert "Traceback" not in out + err
    assert not (dest / "big.bin").exists()
    code, doc, err = sync(hrmctl, lab3, "node2", "--src", str(src), "--dest", "~/sync-stall")
    assert code == 0, err
    assert node_of(doc, "node2")["resumed_bytes"] > 0
    assert tree(dest) == tree(src) and not part.exists()


def test_checksum_finds_and_fixes_a_corrupted_file(lab3, hrmctl, tmp_path):
    src = make_source(tmp_path / "data")
    assert sync(hrmctl, lab3, "node1", "--src", str(src), "--dest", "~/sync-corrupt")[0] == 0
    victim = node_dir(lab3, "node1", "sync-corrupt") / "shards" / "train-000.bin"
    st = victim.stat()
    with open(victim, "r+b") as fh:                       # flip bytes, keep size and mtime
        fh.seek(1000)
        fh.write(b"\xde\xad\xbe\xef")
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, doc, err = sync(hrmctl, lab3, "node1", "--src", str(src), "--dest", "~/sync-corrupt")
    assert code == 0 and node_of(doc, "node1")["sent_files"] == 0     # size+mtime cannot see it
    code, doc, err = sync(hrmctl, lab3, "node1", "--src", str(src), "--dest", "~/sync-corrupt", "--checksum")
    assert code == 0 and node_of(doc, "node1")["to_send"] == ["shards/train-000.bin"]
    assert tree(node_dir(lab3, "node1", "sync-corrupt")) == tree(src)


def test_node_side_refuses_a_symlink_leading_out_of_the_destination(lab3, hrmctl, tmp_path):
    src = tmp_path / "data"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "payload.txt").write_text("must not escape\n")
    node = lab3.node("node2")
    dest, outside = node.home / "sync-trap", node.home / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "sub").symlink_to(outside)
    subprocess.run(["chown", "-R", "-h", f"{node.user}:{node.user}", str(dest), str(outside)], check=True)
    code, out, err = hrmctl("sync-data", "node2", "--src", str(src), "--dest", "~/sync-trap",
                            inventory=lab3.inventory)
    assert code != 0
    assert [l for l in err.splitlines() if l.startswith("error:")] == [
        f"error: node2: {dest}/sub is a symlink on the node where the source has a directory; remove it"]
    assert list(outside.iterdir()) == []


def test_bad_input_is_one_line(lab3, hrmctl, tmp_path):
    src = make_source(tmp_path / "data")
    cases = [
        (("nodex", "--src", str(src)), "unknown node 'nodex'"),
        (("node1", "--src", str(tmp_path / "nope")), "the source directory"),
        (("node1", "--src", str(src), "--dest", "/etc/hrmctl-data"), "not writable by"),
        ((), "name the node to sync"),
    ]
    for args, words in cases:
        code, out, err = hrmctl("sync-data", *args, inventory=lab3.inventory)
        lines = [l for l in err.splitlines() if l.strip()]
        assert code != 0 and "Traceback" not in out + err
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (args, err)
    assert not Path("/etc/hrmctl-data").exists()
    bad_python = tmp_path / "bad-python.toml"
    bad_python.write_text(lab3.inventory.read_text().replace(f'python = "{lab3.python}"',
                                                             'python = "/nonexistent/python3"'))
    code, out, err = hrmctl("sync-data", "node1", "--src", str(src), inventory=bad_python)
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert code != 0 and len(errors) == 1 and "/nonexistent/python3" in errors[0] and "inventory" in errors[0]
    assert "/etc/hrmctl-data" in hrmctl("sync-data", "node1", "--src", str(src), "--dest", "/etc/hrmctl-data",
                                        inventory=lab3.inventory)[2]


@pytest.fixture
def small_disk(lab3):
    """small_disk(size) mounts a tmpfs of that size at node1's ~/small-disk: a disk that really fills up.

    Gives the path as seen from here (through the mount namespace of the node's sshd)."""
    node = lab3.node("node1")
    mnt = node.home / "small-disk"
    mnt.mkdir()
    pw = pwd.getpwnam(node.user)
    in_node = ["nsenter", "-t", str(node.sshd.pid), "-m"]   # the mount namespace the node's sshd sees

    def mount(size: str) -> Path:
        subprocess.run([*in_node, "mount", "-t", "tmpfs", "-o",
                        f"size={size},uid={pw.pw_uid},gid={pw.pw_gid},mode=755", "hrmctl-test", str(mnt)],
                       check=True)
        return Path(f"/proc/{node.sshd.pid}/root") / str(mnt).lstrip("/")

    try:
        yield mount
    finally:
        subprocess.run([*in_node, "umount", str(mnt)], check=False)
        mnt.rmdir()


def test_full_disk_is_one_line_and_nothing_is_changed(lab3, hrmctl, tmp_path, small_disk):
    disk = small_disk("1m")
    src = make_source(tmp_path / "data")
    (disk / "keep.txt").write_text("already there\n")
    code, out, err = hrmctl("sync-data", "node1", "--src", str(src), "--dest", "~/small-disk",
                            inventory=lab3.inventory)
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert code != 0 and len(errors) == 1 and "Traceback" not in out + err
    assert "not enough space" in errors[0] and "node1" in errors[0] and "/small-disk" in errors[0]
    assert sorted(p.name for p in disk.iterdir()) == ["keep.txt"]
    assert (disk / "keep.txt").read_text() == "already there\n"


def test_disk_filling_up_during_the_transfer(lab3, hrmctl, tmp_path, small_disk):
    """Tiny files pass the free-space check (bytes) but each takes a whole page: the disk fills mid-way."""
    disk = small_disk("64k")
    src = tmp_path / "data"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}.txt").write_text(f"file {i}\n" * 10)
    code, out, err = hrmctl("sync-data", "node1", "--src", str(src), "--dest", "~/small-disk",
                            inventory=lab3.inventory)
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert code != 0 and len(errors) == 1 and "Traceback" not in out + err, err
    assert "node1" in errors[0] and "disk is full" in errors[0], errors[0]
    for p in disk.iterdir():                          # whatever has a final name is complete and right
        if not p.name.endswith(PART):
            assert p.read_bytes() == (src / p.name).read_bytes()
    assert len([p for p in disk.iterdir() if not p.name.endswith(PART)]) < 40


def test_small_files_keep_their_mode_and_replace_a_stale_part_file(lab3, hrmctl, tmp_path):
    """Small files go through the node agent, not SFTP: modes, mtimes and leftovers still right."""
    src = tmp_path / "data"
    (src / "d").mkdir(parents=True)
    modes = {"d/private.txt": 0o600, "d/tool.sh": 0o755, "d/group.txt": 0o664, "plain.txt": 0o644}
    for rel, mode in modes.items():
        (src / rel).write_text(f"{rel}\n" * 50)
        (src / rel).chmod(mode)
    dest = node_dir(lab3, "node1", "sync-modes")
    (dest / "d").mkdir(parents=True)
    stale = dest / "d" / f".tool.sh{PART}"
    stale.write_bytes(b"left by an interrupted run, longer than the file itself\n" * 100)
    pw = pwd.getpwnam(lab3.node("node1").user)
    for p in (dest, dest / "d", stale):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    code, doc, err = sync(hrmctl, lab3, "node1", "--src", str(src), "--dest", "~/sync-modes")
    assert code == 0, err
    assert node_of(doc, "node1")["sent_files"] == len(modes)
    assert tree(dest) == tree(src) and not stale.exists()
    assert {rel: (dest / rel).stat().st_mode & 0o7777 for rel in modes} == modes


def test_stalled_link_while_streaming_small_files(lab3, hrmctl, tmp_path):
    """The link dies while small files go through the node agent: one error line, never a half
    file under a final name, and the rerun completes."""
    src = tmp_path / "data"
    src.mkdir()
    for i in range(600):
        (src / f"s{i:03d}.bin").write_bytes(os.urandom(8000))
    node = lab3.node("node2")
    dest = node.home / "sync-stall-small"
    drop = ["iptables", "-I", "INPUT", "-p", "tcp", "--dport", "22", "-j", "DROP"]
    with slow_link(node):
        try:
            proc = start_sync(lab3, tmp_path, "--src", str(src), "node2", "--dest", "~/sync-stall-small",
                              "--stall-timeout", "2")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                if dest.is_dir() and any(not p.name.endswith(PART) for p in dest.iterdir()):
                    break
                time.sleep(0.05)
            node.netns(drop)                               # the link goes dead mid-stream
            out, err = proc.communicate(timeout=60)        # never a hang
        finally:
            node.netns(["iptables", "-D", *drop[2:]], check=False)
    assert proc.returncode not in (0, None), err
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "node2" in errors[0] and "run the same command again" in errors[0], err
    assert "Traceback" not in out + err
    finals = [p for p in dest.iterdir() if not p.name.endswith(PART)]
    assert 0 < len(finals) < 600
    assert all(p.read_bytes() == (src / p.name).read_bytes() for p in finals)
    code, doc, err = sync(hrmctl, lab3, "node2", "--src", str(src), "--dest", "~/sync-stall-small")
    assert code == 0, err
    assert tree(dest) == tree(src) and not [p for p in dest.iterdir() if p.name.endswith(PART)]
