"""Shared fixtures. The cluster tier's nodes come from lab/nodes.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from lab.nodes import Lab, missing_capability, remove_stale

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
def quijote_data(tmp_path_factory):
    """quijote_data(vocab_size, max_tokens): Don Quijote (../shared/data/quijote) prepared as `hrmctl prepare-data`
    prepares a corpus (auralm.data.datadir.main: a byte-level BPE tokenizer trained here, uint16 shards), made once per
    test
    session for each size and shared by every test that asks for that size. Read it; never write into it (copy it
    first). Tests of the preparing itself (tests/unit/test_trainer_data.py) make their own."""
    from auralm.data import datadir
    from tests.trainer.helpers import QUIJOTE

    made: dict[tuple[int, int], Path] = {}

    def get(vocab_size: int = 512, max_tokens: int = 40000) -> Path:
        if (vocab_size, max_tokens) not in made:
            out = tmp_path_factory.mktemp(f"quijote-{vocab_size}-{max_tokens}") / "quijote"
            assert datadir.main([str(QUIJOTE), "--out", str(out), "--vocab-size", str(vocab_size),
                              "--max-tokens", str(max_tokens)]) == 0
            made[vocab_size, max_tokens] = out
        return made[vocab_size, max_tokens]

    return get


@pytest.fixture(scope="session")
def sudoku_data(tmp_path_factory):
    """sudoku_data(count): tests.trainer.helpers.small_sudoku's puzzles (seed 1, 50-60 givens) in a directory named
    sudoku, made once per test session for each count and shared. Read it; never write into it (copy it first)."""
    from tests.trainer.helpers import small_sudoku

    made: dict[int, Path] = {}

    def get(count: int = 1200) -> Path:
        if count not in made:
            made[count] = small_sudoku(tmp_path_factory.mktemp(f"sudoku-{count}") / "sudoku", count)
        return made[count]

    return get


@pytest.fixture(scope="session")
def make_lab():
    """Factory: make_lab(n) gives a Lab of n real SSH nodes, torn down at the end of the session."""
    _require_lab()
    remove_stale()
    labs: list[Lab] = []

    def make(n: int, **kw) -> Lab:
        # One thread a rank (the inventory's `threads`): the lab's nodes share this machine's two cores and each
        # sees both, so the launcher's own choice (two a rank) has their threads spin against each other's: a
        # two-node run of 200 paced steps took 65 s of CPU with it, 15.6 s with one (and 74 s against 49 s)
        kw.setdefault("threads", 1)
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
    same generator with the same seed and the default's train split, and copied to every node; its held-out split
    is 200 puzzles, not the default's 1000, since every sudoku run that reaches its last step evaluates all of them
    (17.5 s of HRM-tiny on a quiet 2-core machine, minutes on a busy one). Tests of that making use other
    directories (tests/cluster/test_launch.py)."""
    from auralm.data.datadir import SUDOKU_DEFAULTS, prepare_sudoku

    lab = make_lab(3)
    made = tmp_path_factory.mktemp("default-data") / "sudoku"
    prepare_sudoku(made, **dict(SUDOKU_DEFAULTS, test=200))
    lab.give_data(made, "sudoku")
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
    if not any(counts.values()):  # the tier was not selected (scripts/test.sh runs it on its own, after the rest)
        return
    terminalreporter.write_line(
        f"cluster tier: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
        f"{counts['error']} errors (real sshd nodes in network namespaces)")
