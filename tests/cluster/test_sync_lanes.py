"""sync-data's extra lanes on real sshd nodes: a helper process with its own connection for large
files, a second node agent for many small files; and the helper only ever adds speed."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from cli.sync import run as sync_mod
from cli.sync import stream as sync_stream
from cli.nodes.inventory import load_inventory
from cli.sync.run import sync_nodes
from cli.sync.lane import HelperLane, SharedFiles
from cli.sync.plan import SourceFile, Transfer
from node.sync_receiver import part_name


def source_file(root: Path, rel: str, size: int) -> SourceFile:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(os.urandom(size))
    st = p.stat()
    return SourceFile(rel, str(p), size, st.st_mtime_ns, 0o644)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_helper_process_sends_part_files_over_its_own_connection(lab3, tmp_path):
    node = load_inventory(lab3.inventory).select("node1")[0]
    home = lab3.node("node1").home
    files = [source_file(tmp_path, f"lane-{i}.bin", 1_500_000 + i) for i in range(3)]
    shared = SharedFiles([Transfer(f) for f in files])
    got, progress = {}, []
    lane = HelperLane(node, accept_new_host_keys=False, root=str(home), stall_timeout=20)
    lane.run(shared, on_bytes=progress.append, on_sent=lambda t, d: got.__setitem__(t.file.rel, d),
             on_resumed=lambda n: None, stopped=lambda: False)
    assert lane.proc.returncode == 0
    assert not shared.items and sum(progress) == sum(f.size for f in files)
    for f in files:  # the part files are complete; the node agent of the sync verifies and renames them
        assert got[f.rel] == digest(Path(f.path)) == digest(home / part_name(f.rel))
        (home / part_name(f.rel)).unlink()


def test_a_helper_that_dies_gives_its_file_back(lab3, tmp_path, monkeypatch):
    node = load_inventory(lab3.inventory).select("node1")[0]
    dies_on_first_job = ("import sys; sys.stdin.readline(); print('{\"ready\": true}', flush=True); "
                         "sys.stdin.readline(); sys.exit(3)")
    monkeypatch.setattr(HelperLane, "command", [sys.executable, "-c", dies_on_first_job])
    t = Transfer(source_file(tmp_path, "x.bin", 1000))
    shared = SharedFiles([t])
    sent = []
    lane = HelperLane(node, accept_new_host_keys=False, root="/nonexistent", stall_timeout=20)
    lane.run(shared, on_bytes=lambda n: None, on_sent=lambda *a: sent.append(a), on_resumed=lambda n: None,
             stopped=lambda: False)
    assert not sent and list(shared.items) == [t]  # back in the list, for the main lane


def test_sync_with_every_lane_and_a_failing_helper_gives_identical_trees(lab3, tmp_path, monkeypatch):
    monkeypatch.setattr(sync_mod, "HELPER_MIN_BYTES", 1)
    monkeypatch.setattr(sync_mod, "SECOND_AGENT_MIN_FILES", 10)
    monkeypatch.setattr(sync_stream, "BATCH_FILES", 3)  # many batches, so that both node agents can take some
    streamed: dict[int, list[str]] = {}  # files sent, by node agent

    def stream_files(agent, root, todo, *args):
        def taken():
            for t in todo:
                streamed.setdefault(id(agent), []).append(t.file.rel)
                yield t
        sync_stream.stream_files(agent, root, taken(), *args)

    monkeypatch.setattr(sync_mod, "stream_files", stream_files)
    src = tmp_path / "data"
    for i in range(4):
        source_file(src, f"shards/big-{i}.bin", 700_000 + 1000 * i)
    for i in range(60):
        source_file(src, f"many/{i // 20}/s-{i:02d}.txt", 100 + i)
    want = {str(p.relative_to(src)): digest(p) for p in src.rglob("*") if p.is_file()}
    nodes = load_inventory(lab3.inventory).select("node1")
    home = lab3.node("node1").home
    for dest, command in (("lanes-ok", HelperLane.command), ("lanes-dead-helper", [sys.executable, "-c", "pass"])):
        monkeypatch.setattr(HelperLane, "command", command)
        report = sync_nodes(nodes, src, dest=f"~/{dest}", progress=False)
        n = report.nodes[0]
        assert report.ok, n.error
        assert n.sent_files == len(want) and n.sent_bytes == sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
        got = {str(p.relative_to(home / dest)): digest(p) for p in (home / dest).rglob("*") if p.is_file()}
        assert got == want  # every file once, under its final name; no part file left
        # two agents took from one list: every small file streamed exactly once (which agent took
        # how many depends on timing: under load one may take them all)
        assert len(streamed) <= 2
        assert sorted(sum(streamed.values(), [])) == sorted(r for r in want if "/many/" in f"/{r}")
        streamed.clear()
