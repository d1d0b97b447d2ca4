"""The suite's CPU, test by test: where the CPU-seconds of `bash scripts/test.sh` go (issue 63: the suite's time on two
cores is its CPU, the cores busy over 90% of it).

    python bench/suite_cpu.py --clear                          # forget an earlier run's figures
    PYTHONPATH=bench bash scripts/test.sh -q -p suite_cpu      # the whole suite, as CI runs it, each test measured
    python bench/suite_cpu.py [--by test|file|tier] [--top 30] [--json]

As a pytest plugin (``-p suite_cpu``), before each test's setup it moves its pytest process into a cpuacct group of
that test's own, and with it whatever is still in the group of the test before: the session's lab nodes (their sshd,
whose sessions run what a test starts on a node), a Slurm daemon. Everything a test starts, here or on a lab node,
is then counted to it, its fixtures' setup included (a module's or session's to the first test that needs it).
Processes of every pytest process of the run (the four workers, the elastic tests beside them, the `alone` phase)
are counted, each test once. What no test starts (the install, the collection) is not.

Needs root and cgroup v1's cpuacct controller (/sys/fs/cgroup/cpuacct, as on this project's machines); the groups are
made under its ``hrmctl-suite-cpu/``, the test names kept in ``$TMPDIR/hrmctl-suite-cpu.tsv``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

try:
    import pytest
except ImportError:  # the report alone, where the test extra is not installed
    pytest = None

HIERARCHY = Path("/sys/fs/cgroup/cpuacct")
ROOT = HIERARCHY / "hrmctl-suite-cpu"
NAMES = Path(tempfile.gettempdir()) / "hrmctl-suite-cpu.tsv"
_current: list[Path | None] = [None]


UNUSABLE = f"needs root and cgroup v1's cpuacct controller at {HIERARCHY}"


def usable() -> bool:
    return os.geteuid() == 0 and (HIERARCHY / "cgroup.procs").is_file()


# ------------------------------------------------------------------------------------------------------ the plugin
def pytest_configure(config) -> None:
    if not usable():
        raise pytest.UsageError(f"suite_cpu: {UNUSABLE}")


def _enter(group: Path) -> None:
    """This process into ``group``, and what is left in the group it was in (the session's lab) with it."""
    group.mkdir(parents=True, exist_ok=True)
    old, _current[0] = _current[0], group
    (group / "cgroup.procs").write_text(str(os.getpid()))
    if old is None or old == group:
        return
    for pid in (old / "cgroup.procs").read_text().split():
        try:
            (group / "cgroup.procs").write_text(pid)
        except OSError:  # it ended meanwhile
            pass


def _key(nodeid: str) -> str:
    return hashlib.sha1(nodeid.encode()).hexdigest()[:16]


def _first(hook):
    """Run before the other plugins' (and the fixtures' setup, so that theirs is counted to the test)."""
    return pytest.hookimpl(tryfirst=True)(hook) if pytest else hook


@_first
def pytest_runtest_setup(item) -> None:
    key = _key(item.nodeid)
    with NAMES.open("a") as f:  # one short append a test: whole lines from every pytest process
        f.write(f"{key}\t{item.nodeid}\n")
    _enter(ROOT / key)



# ------------------------------------------------------------------------------------------------------ the report
def measured() -> list[tuple[float, str]]:
    """(CPU-seconds, test id) of each test measured since the last --clear."""
    names = dict(line.split("\t", 1) for line in NAMES.read_text().splitlines() if "\t" in line) \
        if NAMES.exists() else {}
    rows = []
    for key, nodeid in names.items():
        usage = ROOT / key / "cpuacct.usage"
        if usage.exists():
            rows.append((int(usage.read_text()) / 1e9, nodeid))
    return sorted(rows, reverse=True)


def grouped(rows: list[tuple[float, str]], by: str) -> list[tuple[float, int, str]]:
    """(CPU-seconds, tests, name) by test, by file or by tier (tests/<tier>/), largest first."""
    def name(nodeid: str) -> str:
        path = nodeid.split("::")[0]
        return nodeid if by == "test" else path if by == "file" else "/".join(path.split("/")[:2])

    cpu, count = collections.Counter(), collections.Counter()
    for seconds, nodeid in rows:
        cpu[name(nodeid)] += seconds
        count[name(nodeid)] += 1
    return [(seconds, count[k], k) for k, seconds in cpu.most_common()]


def clear() -> None:
    """The groups removed (a process still in one back to the root group first) and the names forgotten."""
    if ROOT.is_dir():
        for group in [p for p in ROOT.iterdir() if p.is_dir()]:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (HIERARCHY / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            group.rmdir()
        ROOT.rmdir()
    NAMES.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--by", choices=("test", "file", "tier"), default="file")
    ap.add_argument("--top", type=int, default=30, help="rows shown (0: all)")
    ap.add_argument("--json", action="store_true", help="every row as JSON: cpu_s, tests, name")
    ap.add_argument("--clear", action="store_true", help="remove the groups and names of an earlier run")
    args = ap.parse_args(argv)
    if not usable():
        print(f"error: {UNUSABLE}", file=sys.stderr)
        return 2
    if args.clear:
        clear()
        return 0
    rows = measured()
    if not rows:
        print("error: no test measured: run the suite with -p suite_cpu (PYTHONPATH=bench) first", file=sys.stderr)
        return 1
    table = grouped(rows, args.by)
    if args.json:
        print(json.dumps([{"cpu_s": round(s, 2), "tests": n, "name": k} for s, n, k in table]))
        return 0
    total = sum(s for s, _ in rows)
    print(f"{len(rows)} tests, {total:.0f} CPU-s in all")
    for tier in grouped(rows, "tier"):
        print(f"  {tier[2]}: {tier[0]:.0f} CPU-s ({tier[0] / total:.0%}), {tier[1]} tests")
    print(f"\n{'CPU-s':>8} {'share':>6} {'tests':>5}  {args.by}")
    for seconds, n, name in table[:args.top or None]:
        print(f"{seconds:8.1f} {seconds / total:6.1%} {n:5d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
