"""auralm.planning.ddp_check under a real torchrun (2 ranks, gloo, this machine): it passes, and a falsified
result on one rank is caught, named and makes every rank exit non-zero. The backend is agreed by
the ranks as the trainer does it (auralm.training.distributed.setup); for a GPU rank beside a CPU rank only
the device probe is faked (this machine has no GPU), in a wrapper that torchrun starts. The agreement itself (NCCL
that cannot start on some rank, the launcher's HRMCTL_BACKEND as the first guess) is distributed.setup's, the same
call the trainer makes: tests/trainer/test_backend.py runs those cases; here only ddp_check's own --backend and what it
reports of the agreement."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lab import SITE_DIR

pytestmark = pytest.mark.slow  # real torchrun processes

ROOT = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
GPU = {"cuda": True, "nccl": True, "why": ""}

# Runs ddp_check with probe_device faked on the ranks named in HRMCTL_TEST_FAKE_PROBE ({"rank": answer}).
FAKE_PROBE_WRAPPER = """
import json, os, sys
from auralm.planning import ddp_check
from auralm.training import distributed
fake = json.loads(os.environ["HRMCTL_TEST_FAKE_PROBE"]).get(os.environ["RANK"])
if fake:
    distributed.probe_device = lambda local_rank: fake
sys.exit(ddp_check.main())
"""


def _result(p: subprocess.CompletedProcess) -> tuple[int, dict | None, str]:
    line = next((l for l in p.stdout.splitlines() if l.startswith("HRMCTL_RESULT ")), None)
    return p.returncode, json.loads(line.split(" ", 1)[1]) if line else None, p.stdout + p.stderr


def run(*args: str, entry: tuple[str, ...] = ("-m", "auralm.planning.ddp_check"), env: dict | None = None):
    full_env = {k: v for k, v in os.environ.items() if k != "HRMCTL_BACKEND"}
    full_env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(SITE_DIR)]), OMP_NUM_THREADS="1", **(env or {}))
    return _result(subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                                   "--standalone", *entry, "--no-table", *args],
                                  capture_output=True, text=True, cwd=ROOT, timeout=180, env=full_env))


def run_faked(tmp_path: Path, fake: dict, *args: str):
    wrapper = tmp_path / "fake_probe_ddp_check.py"
    wrapper.write_text(FAKE_PROBE_WRAPPER)
    return run("--no-bandwidth", *args, entry=(str(wrapper),), env={"HRMCTL_TEST_FAKE_PROBE": json.dumps(fake)})


def test_correct_world_of_two_and_busbw_formula():
    # the model's timing left out (the training section is tested in tests/cluster/test_link_advice.py): about 5 s of
    # CPU, the default model's steps on both ranks for PROBE_SECONDS
    code, res, out = run("--max-size", "4KiB", "--seconds", "0.01", "--probe-seconds", "0")
    assert code == 0, out
    assert res["training"]["compute"]["error"] == "not timed"
    assert res["ok"] and res["world_size"] == 2 and [r["rank"] for r in res["ranks"]] == [0, 1]
    assert res["backend"] == "gloo" and res["reason"] == f"rank 0 ({HOST}) cannot use NCCL: no CUDA device"
    assert [r["bytes"] for r in res["bandwidth"]] == [1024, 4096]
    for row in res["bandwidth"]:
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / (row["time_us"] / 1e6) / 1e9)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * (2 - 1) / 2)


def test_a_wrong_result_is_caught_and_exits_non_zero():
    code, res, out = run("--no-bandwidth", "--corrupt-rank", "1", "--backend", "gloo")
    assert code != 0
    assert (res["backend"], res["requested"], res["reason"]) == ("gloo", "gloo", "gloo requested")  # its own option
    assert res is not None and not res["ok"] and res["checks"]["all_reduce"] == [1]
    assert res["checks"]["broadcast"] == []


def test_a_gpu_rank_beside_a_cpu_rank_agrees_on_gloo_and_names_the_rank(tmp_path):
    code, res, out = run_faked(tmp_path, {"0": GPU})
    assert code == 0, out
    why = f"rank 1 ({HOST}) cannot use NCCL: no CUDA device"
    assert (res["backend"], res["requested"], res["reason"], res["ok"]) == ("gloo", "auto", why, True)
    assert [(r["backend"], r["reason"], r["device"]) for r in res["ranks"]] == [("gloo", why, "cpu")] * 2


def test_alone_outside_torchrun_is_a_world_of_one():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "HRMCTL_BACKEND")}
    code, res, out = _result(subprocess.run([sys.executable, "-m", "auralm.planning.ddp_check", "--no-bandwidth"],
                                            capture_output=True, text=True, cwd=ROOT, timeout=120, env=env))
    assert code == 0, out
    assert out.startswith(f"world 1, backend gloo (rank 0 ({HOST}) cannot use NCCL: no CUDA device)\n"), out
    assert res["world_size"] == 1 and res["ok"] and res["backend"] == "gloo"


def test_bad_backend_request_is_one_error_line():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    p = subprocess.run([sys.executable, "-m", "auralm.planning.ddp_check", "--no-bandwidth"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120, env=dict(env, HRMCTL_BACKEND="infiniband"))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "error: HRMCTL_BACKEND='infiniband': expected auto, nccl or gloo\n"
