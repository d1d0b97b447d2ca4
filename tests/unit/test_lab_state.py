"""The lab's state files (lab/nodes.py): every test process's remove_stale reads them while other processes make and
remove labs. A file gone between the listing and the read is a lab its owner removed (a CI run failed on that,
2026-11-28: FileNotFoundError in remove_stale), and a state file is never seen half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lab import nodes


def _no_cgroups(monkeypatch, removed: list) -> None:
    monkeypatch.setattr(nodes, "_remove", lambda token, users, namespaces, bridge, lab_dir: removed.append(
        (token, users)))
    monkeypatch.setattr(nodes, "lab_cgroups", lambda *token: [])


def test_a_state_file_removed_after_the_listing_is_left_alone(tmp_path, monkeypatch):
    class ListedBeforeItsLabWentDown:  # the state directory as the listing saw it: that file has been removed since
        def is_dir(self) -> bool:
            return True

        def glob(self, pattern: str):
            return [tmp_path / "6ea7.json"]

        def __truediv__(self, name: str):
            return tmp_path / name

    removed: list = []
    monkeypatch.setattr(nodes, "STATE_DIR", ListedBeforeItsLabWentDown())
    _no_cgroups(monkeypatch, removed)
    nodes.remove_stale()
    assert removed == []


def test_a_dead_owners_lab_is_removed_and_a_live_owners_kept(tmp_path, monkeypatch):
    removed: list = []
    monkeypatch.setattr(nodes, "STATE_DIR", tmp_path / "state")
    _no_cgroups(monkeypatch, removed)
    dead = subprocess.Popen(["true"])
    dead.wait()
    nodes.write_state("dead", {"pid": dead.pid, "n": 2})
    nodes.write_state("live", {"pid": os.getpid(), "n": 1})
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["dead.json", "live.json"]  # nothing half-made
    assert json.loads((tmp_path / "state" / "live.json").read_text()) == {"pid": os.getpid(), "n": 1}
    nodes.remove_stale()
    assert removed == [("dead", ["hrmdeadn0", "hrmdeadn1"])]


def test_the_copy_onto_a_node_leaves_out_the_caches_other_test_processes_write(tmp_path):
    names = [".git", ".hypothesis", ".pytest_cache", "__pycache__", "cli", "runs", "README.md"]
    assert nodes.COPY_IGNORE(str(nodes.ROOT), names) == {".hypothesis", ".pytest_cache", "__pycache__", "runs"}
    assert nodes.COPY_IGNORE(str(nodes.ROOT / "tests"), names) == {".hypothesis", ".pytest_cache", "__pycache__"}


def test_a_lab_venv_is_ready_by_its_stamp_and_one_without_is_asked_once(tmp_path):
    """Every lab asks whether the nodes' venv is there: its stamp answers, no Python started (one importing torch
    costs 1.4 s of CPU); a venv from before stamps is asked by its Python once and stamped; one whose stamp lists
    other packages, or (with no stamp) whose Python cannot import what it must, is not ready (it is made again)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    ran = tmp_path / "ran"
    python.write_text(f"#!/bin/sh\necho >> {ran}\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    made_with = {"python": "/usr/bin/python3", "packages": ["json"]}
    assert nodes._venv_ready(venv, made_with, "import json")  # no stamp yet: asked, then stamped
    assert ran.read_text().count("\n") == 1 and json.loads((venv / nodes.STAMP_NAME).read_text()) == made_with
    assert nodes._venv_ready(venv, made_with, "import json")  # the stamp answers: not asked again
    assert ran.read_text().count("\n") == 1
    other = dict(made_with, packages=["json", "csv"])  # the requirements changed: made again, Python not asked
    assert not nodes._venv_ready(venv, other, "import json")
    assert ran.read_text().count("\n") == 1
    (venv / nodes.STAMP_NAME).unlink()  # no stamp, and a Python that cannot import what it must: not ready
    assert not nodes._venv_ready(venv, made_with, "import no_such_module_here")
    assert ran.read_text().count("\n") == 2 and not (venv / nodes.STAMP_NAME).exists()
    python.unlink()
    assert not nodes._venv_ready(venv, made_with, "import json")  # no Python: not ready whatever the stamp says
