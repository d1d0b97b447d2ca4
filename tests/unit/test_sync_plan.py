"""sync-data's pure parts: the source manifest, the plan, and the node side's path checks."""

from __future__ import annotations

import os

import pytest

from cli.sync.plan import SyncError, make_plan, scan_source
from node.sync_receiver import Refused, check_rel, final_of_part, inside, part_name


def test_part_names_round_trip():
    for rel in ("a.bin", "dir with space/it's \"q\".txt", "x/y/z"):
        assert final_of_part(part_name(rel)) == rel
    assert part_name("d/f.bin") == "d/.f.bin.hrmctl-part"
    assert final_of_part("d/f.bin") is None and final_of_part(".hrmctl-part") is None


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "", "a/\0b"])
def test_node_side_refuses_paths_that_leave_the_destination(rel):
    with pytest.raises(Refused):
        check_rel(rel)


def test_node_side_refuses_a_symlinked_directory_leading_out(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "in").mkdir()
    (root / "out").symlink_to(outside)
    (root / "alias").symlink_to(root / "in")
    real = os.path.realpath(root)
    assert inside(real, "in/f") == os.path.join(real, "in", "f")
    assert inside(real, "alias/f")                      # a symlink that stays inside is fine
    with pytest.raises(Refused, match="outside the destination"):
        inside(real, "out/f")


def test_source_scan_skips_escaping_symlinks_and_reserved_names(tmp_path):
    src = tmp_path / "data"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.txt").write_text("a")
    (src / "in").symlink_to("d/a.txt")
    (src / "out").symlink_to("/etc/hostname")
    (src / "dirlink").symlink_to(src / "d")
    (src / ".x.hrmctl-part").write_text("reserved")
    got = scan_source(src, checksum=True)
    assert sorted(got.files) == ["d/a.txt", "in"] and got.dirs == ["d"]
    assert got.files["in"].size == 1 and got.files["in"].sha256 == got.files["d/a.txt"].sha256
    assert {rel for rel, _ in got.skipped} == {"out", "dirlink", ".x.hrmctl-part"}


def test_source_scan_order_and_what_it_cannot_send(tmp_path):
    src = tmp_path / "data"
    for d in ("b/y", "a/z", "a/x"):
        (src / d).mkdir(parents=True)
    for f in ("b/y/2", "a/1", "a/z/3", "a/x/4", "0"):
        (src / f).write_text(f)
    os.mkfifo(src / "a" / "pipe")
    (src / "b" / "dangling").symlink_to("gone")
    got = scan_source(src, checksum=False)
    assert got.dirs == ["a", "b", "a/x", "a/z", "b/y"]            # parents before their children
    assert list(got.files) == ["0", "a/1", "a/x/4", "a/z/3", "b/y/2"]
    assert got.files["a/x/4"].path == str(src / "a" / "x" / "4")
    why = dict(got.skipped)
    assert why["a/pipe"] == "not a regular file" and why["b/dangling"].startswith("cannot read")


def test_missing_source_is_one_line(tmp_path):
    with pytest.raises(SyncError, match="does not exist.*--src DIR"):
        scan_source(tmp_path / "nope", checksum=False)


def test_plan_sends_only_changes_resumes_parts_and_orders_deletes(tmp_path):
    src = tmp_path / "data"
    (src / "keep").mkdir(parents=True)
    for name in ("same", "changed", "new", "partly"):
        (src / "keep" / name).write_text(name * 100)
    source = scan_source(src, checksum=False)
    f = source.files
    node = {
        "files": {"keep/same": [f["keep/same"].size, f["keep/same"].mtime_ns, None],
                  "keep/changed": [f["keep/changed"].size, f["keep/changed"].mtime_ns + 10**9, None],
                  "gone/x": [1, 1, None], "old": [1, 1, None]},
        "dirs": ["keep", "gone", "gone/deeper"],
        "parts": {"keep/partly": [50, "abc"], "old": [1, "def"]},
        "links": ["stray-link"],
    }
    plan = make_plan(source, node, checksum=False, delete=True)
    assert sorted(t.file.rel for t in plan.send) == ["keep/changed", "keep/new", "keep/partly"]
    partly = next(t for t in plan.send if t.file.rel == "keep/partly")
    assert (partly.offset, partly.part_sha256) == (50, "abc")
    assert plan.unchanged == 1 and plan.stale_parts == ["old"] and plan.missing_dirs == []
    assert plan.delete == ["gone/x", "old", "stray-link", "gone/deeper", "gone"]
    assert make_plan(source, node, checksum=False, delete=False).delete == []
    assert plan.bytes_to_send == sum(x.file.size for x in plan.send) - 50


def test_small_files_are_shared_in_runs_of_one_directory(monkeypatch):
    from cli.sync import run as sync
    from cli.sync.plan import SourceFile, Transfer

    rels = [f"a/{i}" for i in range(5)] + ["b/0", "b/1", "top"] + [f"a/{i}" for i in range(5, 7)]
    todo = [Transfer(SourceFile(rel, rel, 1, 0, 0o644)) for rel in rels]
    monkeypatch.setattr(sync, "SHARE_FILES", 3)
    runs = sync._directory_runs(todo)
    assert [[t.file.rel for t in run] for run in runs] == [
        ["a/0", "a/1", "a/2"], ["a/3", "a/4"], ["b/0", "b/1"], ["top"], ["a/5", "a/6"]]
