"""Shared fixtures. The cluster tier's nodes come from lab/nodes.py."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from lab import SITE_DIR
from lab.nodes import Lab, missing_capability, remove_stale

IN_CI = os.environ.get("CI", "").lower() == "true"
REPO = Path(__file__).resolve().parents[1]
DATA_CACHE = Path(tempfile.gettempdir()) / "hrmctl-test-data"


# the suite's processes (and what they start) fork torchrun's ranks from its agent: lab/forked_ranks.py, the suite's
# start-up, never the product's
os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])

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
    """hrmctl's cache (torch facts, trainer checks) of this test session, not the user's. Its model-size estimates
    are one file for every test process on this machine (a link to DATA_CACHE's; cli/cache.py writes through it):
    they are keyed by the trainer's source and what the estimate reads, so a run of the same model in another
    process (the phases of scripts/test.sh, its xdist workers) skips its estimate (a process importing torch); so is
    `hrmctl setup`'s wheel pool. The rest stays the session's own: test-ddp's link figures, say, are keyed by node
    names that every lab shares."""
    if "HRMCTL_CACHE" in os.environ:
        return
    from cli.launch.plan.memory import SIZING_CACHE_NAME

    cache = tmp_path_factory.mktemp("hrmctl-cache")
    (DATA_CACHE / "wheels").mkdir(parents=True, exist_ok=True)
    (cache / SIZING_CACHE_NAME).symlink_to(DATA_CACHE / SIZING_CACHE_NAME)
    # `hrmctl setup`'s wheel pool (cli/setup/local.py: downloaded wheels, hard-linked into each node's set) is
    # this machine's too, downloaded once a machine rather than once a session: what a wheel is does not change
    (cache / "wheels").symlink_to(DATA_CACHE / "wheels")
    os.environ["HRMCTL_CACHE"] = str(cache)


def made_once(name: str, args: tuple, make) -> Path:
    """``<dir>/<name>``, which ``make(path)`` fills: made once for every test process on this machine (the phases
    of scripts/test.sh and the elastic files beside them each start their own) and kept, in a directory named by
    ``args`` and the source of auralm/data (a change to the making makes it anew). Read it; never write into it."""
    key = hashlib.sha256(repr(args).encode())
    for source in sorted((REPO / "auralm" / "data").glob("*.py")):
        key.update(source.read_bytes())
    home = DATA_CACHE / f"{name}-{key.hexdigest()[:16]}"
    done = home / ".complete"
    if not done.exists():
        DATA_CACHE.mkdir(parents=True, exist_ok=True)
        with open(f"{home}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another test process making it: wait for it
            if not done.exists():
                shutil.rmtree(home, ignore_errors=True)
                make(home / name)
                done.touch()
    return home / name


@pytest.fixture(scope="session")
def quijote_data():
    """quijote_data(vocab_size, max_tokens): Don Quijote (../shared/data/quijote) prepared as `hrmctl prepare-data`
    prepares a corpus (in this process: a byte-level BPE tokenizer trained here, uint16 shards), made once
    for each size (``made_once``) and shared by every test that asks for that size. Read it; never write into it (copy
    it first). Tests of the preparing itself (tests/unit/test_trainer_data.py) make their own."""
    from tests.trainer.helpers import QUIJOTE, prepare_data

    made: dict[tuple[int, int], Path] = {}

    def get(vocab_size: int = 512, max_tokens: int = 40000) -> Path:
        if (vocab_size, max_tokens) not in made:
            def make(out: Path) -> None:
                assert prepare_data([str(QUIJOTE), "--out", str(out), "--vocab-size", str(vocab_size),
                                     "--max-tokens", str(max_tokens)]) == 0

            text = QUIJOTE.stat()
            made[vocab_size, max_tokens] = made_once("quijote", (vocab_size, max_tokens, text.st_size, text.st_mtime),
                                                     make)
        return made[vocab_size, max_tokens]

    return get


@pytest.fixture(scope="session")
def sudoku_data():
    """sudoku_data(count): tests.trainer.helpers.small_sudoku's puzzles (seed 1, 50-60 givens) in a directory named
    sudoku, made once for each count (``made_once``) and shared. Read it; never write into it (copy it first)."""
    import inspect

    from tests.trainer.helpers import small_sudoku

    made: dict[int, Path] = {}

    def get(count: int = 1200) -> Path:
        if count not in made:
            made[count] = made_once("sudoku", (count, inspect.getsource(small_sudoku)),
                                    lambda out: small_sudoku(out, count))
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
def nodes_sudoku() -> Path:
    """What a lab node holds as its default sudoku data (~/hrmctl/data/sudoku, what the trainer makes there at its
    first run), made once (``made_once``) by the same generator with the same seed and the default's train split;
    its held-out split is 200 puzzles, not the default's 1000, since every sudoku run that reaches its last step
    evaluates all of them (17.5 s of HRM-tiny on a quiet 2-core machine, minutes on a busy one). The making on a
    node itself is tested where it is the point (tests/cluster/test_launch.py)."""
    from auralm.data.datadir import SUDOKU_DEFAULTS, prepare_sudoku

    options = dict(SUDOKU_DEFAULTS, test=200)
    return made_once("sudoku", tuple(sorted(options.items())), lambda out: prepare_sudoku(out, **options))


@pytest.fixture(scope="session")
def lab3(make_lab, nodes_sudoku) -> Lab:
    """Three healthy nodes shared by the tests that leave them healthy (undo your faults), each with
    ``nodes_sudoku`` as its default data."""
    lab = make_lab(3)
    lab.give_data(nodes_sudoku, "sudoku")
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
    if not any(counts.values()):  # the tier was not selected (e.g. the fast tier)
        return
    terminalreporter.write_line(
        f"cluster tier: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, "
        f"{counts['error']} errors (real sshd nodes in network namespaces)")
