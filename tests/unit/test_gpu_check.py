"""bench/gpu_check.py where there is no GPU (this machine): it says so and exits 0; and its verdict, fed results: a
failed check makes the table say so and the exit code 1. The checks themselves need a CUDA GPU."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import gpu_check  # noqa: E402
from bench.gpu_check import FAIL, OK, Outcome  # noqa: E402


def no_gpu_here() -> bool:
    import torch

    return not torch.cuda.is_available()


@pytest.mark.skipif(not no_gpu_here(), reason="this machine has a CUDA GPU")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("no CUDA GPU found (torch ") and "nothing to check" in lines[0]


def table(outcomes: list[Outcome]) -> tuple[int, str]:
    out = io.StringIO()
    code = gpu_check.report(outcomes, Console(file=out, width=200, color_system=None), "NVIDIA H100 80GB HBM3")
    return code, out.getvalue()


def test_all_passed_is_exit_0():
    code, text = table([Outcome("bf16", OK, "loss 8.3 -> 6.1", 12.0), Outcome("mfu", OK, "MFU 31.20%", 1.5)])
    assert code == 0
    assert "gpu_check — NVIDIA H100 80GB HBM3" in text and "MFU 31.20%" in text
    assert "summary: 2 of 2 checks passed in 14s" in text.splitlines()[-1]


def test_a_failed_check_is_marked_and_exits_1():
    outcomes = [Outcome("bf16", OK, "loss 8.3 -> 6.1", 12.0),
                Outcome("memory", FAIL, "estimate 1.00 GiB, measured peak 2.10 GiB: measured/estimate 2.10", 9.0),
                Outcome("mfu", OK, "MFU 31.20%", 1.5)]
    code, text = table(outcomes)
    assert code == 1
    row = next(line for line in text.splitlines() if "memory" in line)
    assert "fail" in row and "measured/estimate 2.10" in row
    assert text.splitlines()[-1].endswith("2 of 3 checks passed in 22s; failed: memory")


def test_a_check_that_printed_no_result_or_was_not_run_is_a_failure():
    broken = gpu_check.parse_outcome("fp16", 1, "some output\n", "Traceback ...\nRuntimeError: CUDA error\n", 3.0)
    assert broken.status == FAIL and broken.detail == "no result (exit code 1): RuntimeError: CUDA error"
    fine = gpu_check.parse_outcome("fp16", 0, 'x\nGPU_CHECK {"status": "ok", "detail": "scale 65536.0"}\n', "", 3.0)
    assert fine.status == OK and fine.detail == "scale 65536.0"
    assert gpu_check.exit_code([fine, broken]) == 1 and gpu_check.exit_code([]) == 1
    [late] = gpu_check.run_all(["mfu"], 0.0, Path("/nonexistent"))  # no time left: not started
    assert late.status == FAIL and late.detail.startswith("not run: 0s of the 0s budget left")
