"""sync-data to this machine (`localhost`, no SSH): same plan, agent and atomic rename as a node."""

from __future__ import annotations

import hashlib
import os

from cli.inventory import local_node
from cli.sync import sync_nodes


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
