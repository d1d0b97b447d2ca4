"""auralm.ddp_check under a real torchrun (2 ranks, gloo, this machine): it passes, and a falsified
result on one rank is caught, named and makes every rank exit non-zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real torchrun processes

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> tuple[int, dict | None, str]:
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--standalone",
                        "-m", "auralm.ddp_check", "--no-table", *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=180)
    line = next((l for l in p.stdout.splitlines() if l.startswith("HRMCTL_RESULT ")), None)
    return p.returncode, json.loads(line.split(" ", 1)[1]) if line else None, p.stdout + p.stderr


def test_correct_world_of_two_and_busbw_formula():
    code, res, out = run("--max-size", "4KiB", "--seconds", "0.01")
    assert code == 0, out
    assert res["ok"] and res["world_size"] == 2 and [r["rank"] for r in res["ranks"]] == [0, 1]
    assert [r["bytes"] for r in res["bandwidth"]] == [1024, 4096]
    for row in res["bandwidth"]:
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / (row["time_us"] / 1e6) / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * (2 - 1) / 2)


def test_a_wrong_result_is_caught_and_exits_non_zero():
    code, res, out = run("--no-bandwidth", "--corrupt-rank", "1")
    assert code != 0
    assert res is not None and not res["ok"] and res["checks"]["all_reduce"] == [1]
    assert res["checks"]["broadcast"] == []
