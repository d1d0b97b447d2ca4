"""Shared fixtures. The cluster tier's nodes come from tests/lab.py."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.lab import Lab, missing_capability, remove_stale, sh

IN_CI = os.environ.get("CI", "").lower() == "true"


LAB_MISSING = missing_capability()  # no root, or no ip/sshd/iptables on this machine: the reason, else None


def pytest_collection_modifyitems(items):
    """Off CI, a test that needs lab nodes is skipped where they cannot be made, with the reason; on CI it
    runs and its fixture fails (``make_lab``)."""
    if LAB_MISSING and not IN_CI:
        for item in items:
            if "make_lab" in item.fixturenames:
                item.add_marker(pytest.mark.skipif(True, reason=LAB_MISSING))


def _require_lab() -> None:
    if LAB_MISSING:
        pytest.fail(f"cluster tier must run on CI but cannot: {LAB_MISSING}")


@pytest.fixture
def one_thread():
    """One torch thread in the test process: steady timing on a shared 2-core machine (the trainer does not
    care). A test module takes it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def own_cache(tmp_path_factory):
    """hrmctl's cache (torch facts, trainer checks) of this test session, not the user's."""
    os.environ.setdefault("HRMCTL_CACHE", str(tmp_path_factory.mktemp("hrmctl-cache")))


@pytest.fixture(scope="session")
def make_lab():
    """Factory: make_lab(n) gives a Lab of n real SSH nodes, torn down at the end of the session."""
    _require_lab()
    remove_stale()
    labs: list[Lab] = []

    def make(n: int, **kw) -> Lab:
        lab = Lab(n, **kw)
        labs.append(lab)
        try:
            lab.up()
        except Exception as exc:  # a fixture that cannot set up its nodes fails, never skips
            pytest.fail(f"could not set up {n} lab nodes: {exc}")
        return lab

    yield make
    for lab in labs:
        lab.down()


@pytest.fixture(scope="session")
def lab3(make_lab, tmp_path_factory) -> Lab:
    """Three healthy nodes shared by the tests that leave them healthy (undo your faults). Each node's default
    sudoku data (~/hrmctl/data/sudoku, what the trainer makes there at its first run) is made once here, by the
    same generator with the same seed, and copied to every node: the files are the ones each node would make.
    Tests of that making use other directories (tests/cluster/test_launch.py)."""
    from auralm.data import ensure_sudoku

    lab = make_lab(3)
    made = tmp_path_factory.mktemp("default-data") / "sudoku"
    ensure_sudoku(made)
    for node in lab.nodes:
        data = node.home / "hrmctl" / "data"
        data.mkdir(exist_ok=True)
        shutil.copytree(made, data / "sudoku")
        sh(["chown", "-R", f"{node.user}:{node.user}", str(data)])
    return lab


@pytest.fixture
def hrmctl(tmp_path):
    """Run the real CLI as a subprocess: hrmctl(*args) -> (exit code, stdout, stderr)."""
    import subprocess

    def run(*args: str, inventory=None, timeout: float = 300, env=None, cwd=None):
        cmd = [sys.executable, "-m", "cli", *args]
        full_env = dict(os.environ, **(env or {}))
        if inventory is not None:
            full_env["HRMCTL_INVENTORY"] = str(inventory)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=cwd or tmp_path)
        return proc.returncode, proc.stdout, proc.stderr

    return run


def pytest_terminal_summary(terminalreporter):
    """Say how many cluster-tier tests really ran, so a skipped tier cannot pass unnoticed."""
    counts = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        counts[outcome] = sum(1 for r in terminalreporter.stats.get(outcome, [])
                              if "tests/cluster/" in getattr(r, "nodeid", ""))
    terminalreporter.write_line(
        f"cluster tier: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
        f"{counts['error']} errors (real sshd nodes in network namespaces)")
