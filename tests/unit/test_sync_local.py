"""sync-data to this machine (`localhost`, no SSH): same plan, agent and atomic rename as a node."""

from __future__ import annotations

import hashlib
import os

from cli.nodes.inventory import local_node
from cli.sync.run import sync_nodes


def digest_tree(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_local_sync_resumes_a_part_file_and_deletes_extras(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest with space"
    (src / "d").mkdir(parents=True)
    big = os.urandom(300_000)
    (src / "d" / "big.bin").write_bytes(big)
    (src / "small.txt").write_text("small\n")
    (dest / "d").mkdir(parents=True)
    (dest / "d" / ".big.bin.hrmctl-part").write_bytes(big[:100_000])   # an interrupted earlier run
    (dest / "extra.txt").write_text("not in the source\n")

    report = sync_nodes([local_node()], src, dest=str(dest), delete=True, progress=False)
    node = report.nodes[0]
    assert report.ok, node.error
    assert node.resumed_bytes == 100_000 and node.sent_bytes == 200_000 + len("small\n")
    assert node.deleted == ["extra.txt"]
    assert digest_tree(dest) == digest_tree(src)
    assert (dest / "d" / "big.bin").stat().st_mtime_ns == (src / "d" / "big.bin").stat().st_mtime_ns

    again = sync_nodes([local_node()], src, dest=str(dest), progress=False).nodes[0]
    assert again.sent_files == 0 and again.sent_bytes == 0 and again.unchanged == 2


def _corrupt_sent_parts(monkeypatch, dest, times: int) -> None:
    """Flip a byte of each part file the first `times` times it is complete (a bad disk on the node)."""
    from cli.sync import send as sync_send

    real_add = sync_send.Finalizer.add
    seen: dict[str, int] = {}

    def add(self, t, digest):
        if seen.get(t.file.rel, 0) < times:
            seen[t.file.rel] = seen.get(t.file.rel, 0) + 1
            part = dest / sync_send.part_name(t.file.rel)
            data = bytearray(part.read_bytes())
            data[0] ^= 0xFF
            part.write_bytes(bytes(data))
        real_add(self, t, digest)

    monkeypatch.setattr(sync_send.Finalizer, "add", add)


def _sync_with_corruption(tmp_path, monkeypatch, times: int):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(50_000))
    _corrupt_sent_parts(monkeypatch, dest, times=times)
    return src, dest, sync_nodes([local_node()], src, dest=str(dest), progress=False).nodes[0]


def test_a_mismatch_after_transfer_is_sent_again_once(tmp_path, monkeypatch):
    src, dest, node = _sync_with_corruption(tmp_path, monkeypatch, times=1)
    assert node.ok and node.resent_files == 1
    assert digest_tree(dest) == digest_tree(src)


def test_a_mismatch_twice_is_reported_and_nothing_is_renamed(tmp_path, monkeypatch):
    src, dest, node = _sync_with_corruption(tmp_path, monkeypatch, times=2)
    assert not node.ok and "f.bin differs on the node after being sent twice" in node.error
    assert list(dest.iterdir()) == []


def test_a_node_python_that_ends_at_once_is_named_whether_the_send_or_the_read_finds_its_channel_closed():
    """A wrong `python` for a node: its command ends at once and its channel with it, so the first job's send can
    find the channel closed before the read does (CI run 68 saw "Socket is closed" from paramiko there). Either way
    the one line names the node's Python and the inventory; once the Python has answered, the same is a lost link.
    The send side is real: a local node whose `python` is /bin/false, ended before the job is sent. The read side
    is a channel whose read fails (an SSH channel's error cannot be made on demand here)."""
    import dataclasses
    from types import SimpleNamespace

    import pytest

    from cli.nodes.remote import LocalSession
    from cli.sync.plan import SyncError
    from cli.sync.send import NodeAgent

    node = dataclasses.replace(local_node("node1"), python="/bin/false")
    sent = NodeAgent(LocalSession(node), stall_timeout=5)
    sent.pipe.proc.wait(10)  # ended: the send finds its stdin closed (BrokenPipeError)

    class ReadFails:
        def send(self, data, timeout=None):
            pass

        def readline(self, timeout=None):
            raise EOFError("the channel is closed")

        def close(self):
            pass

    read = NodeAgent(SimpleNamespace(node=node, pipe=lambda argv: ReadFails()), stall_timeout=5)
    for agent in (sent, read):
        with pytest.raises(SyncError) as e:
            agent.call({"op": "scan"})
        assert str(e.value).startswith("node1: the node's Python (/bin/false) ended without an answer ("), str(e.value)
        assert "check `python` for this node in the inventory" in str(e.value)
        agent.answered = True
        with pytest.raises(SyncError) as e:
            agent.call({"op": "scan"})
        assert str(e.value).startswith("node1: the connection to the node was lost ("), str(e.value)
    sent.close()


def test_the_node_s_heartbeats_are_progress_and_its_answer_comes_after_them():
    """While the receiver works on a job it says {"alive": true} every HEARTBEAT_S (node/lines.py); the agent takes
    those as progress and returns the job's answer after them; a line that is no JSON object is an unexpected answer."""
    from types import SimpleNamespace

    import pytest

    from cli.sync.plan import SyncError
    from cli.sync.send import NodeAgent

    class Replies:
        def __init__(self, *lines):
            self.lines = list(lines)

        def send(self, data, timeout=None):
            pass

        def readline(self, timeout=None):
            return self.lines.pop(0)

        def close(self):
            pass

    node = local_node("node1")
    for replies, answer in ((['{"alive":true}', '{"alive":true}', '{"ok":true,"free":5}'], {"ok": True, "free": 5}),
                            (['{"alive":true}', "garbage"], None)):
        agent = NodeAgent(SimpleNamespace(node=node, pipe=lambda argv, r=replies: Replies(*r)), stall_timeout=5)
        if answer is not None:
            assert agent.call({"op": "space"}) == answer and agent.answered
            continue
        with pytest.raises(SyncError, match="unexpected answer from the node's Python: 'garbage'"):
            agent.call({"op": "space"})
