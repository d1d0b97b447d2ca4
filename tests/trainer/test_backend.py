"""One backend for all ranks, agreed at start. Only the device probe is faked (this machine has no GPU);
the process group, the agreement and the NCCL start attempt are real."""

from __future__ import annotations

import socket

import pytest

from tests.trainer.helpers import records, run_ranks, tiny_args

pytestmark = pytest.mark.slow
GPU = {"cuda": True, "nccl": True, "why": ""}
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(300)


def test_nccl_requested_on_cpu_ranks_gives_gloo_on_all_with_the_reason_logged(sudoku_dir, tmp_path):
    results = run_ranks(2, tiny_args(sudoku_dir, tmp_path / "run", "training.max_steps=2", "backend=nccl"), tmp_path)
    assert all(r["exit"] == 0 for r in results), [r.get("traceback") for r in results]
    event = records(tmp_path / "run", "events.jsonl")[0]
    assert (event["kind"], event["backend"], event["requested"]) == ("backend", "gloo", "nccl")
    assert event["message"] == (f"backend: nccl requested, but rank 0 ({HOST}) cannot use NCCL: no CUDA device; "
                                "using gloo on all 2 ranks, device cpu")


def test_a_gpu_rank_beside_a_cpu_rank_trains_with_gloo_on_cpu(sudoku_dir, tmp_path):
    results = run_ranks(2, tiny_args(sudoku_dir, tmp_path / "run", "training.max_steps=2"), tmp_path,
                        fake_probe={"0": GPU})
    assert all(r["exit"] == 0 for r in results), [r.get("traceback") for r in results]
    event = records(tmp_path / "run", "events.jsonl")[0]
    assert event["backend"] == "gloo"
    assert f"rank 1 ({HOST}) cannot use NCCL: no CUDA device; using gloo on all 2 ranks, device cpu" in event["message"]


def test_nccl_that_cannot_start_on_some_rank_falls_back_to_gloo_on_every_rank(tmp_path):
    # Every rank claims a GPU, so the ranks really try to start NCCL; on this CPU-only torch that fails.
    results = run_ranks(3, ["backend=nccl"], tmp_path, setup_only=True, fake_probe={str(r): GPU for r in range(3)})
    assert [r["exit"] for r in results] == [0, 0, 0], [r.get("traceback") for r in results]
    assert [r["backend"] for r in results] == ["gloo"] * 3
    assert len({r["why"] for r in results}) == 1
    assert results[0]["why"].startswith(f"NCCL could not start on rank 0 ({HOST}): ")


def test_the_launchers_choice_is_the_first_guess(tmp_path, monkeypatch):
    monkeypatch.setenv("HRMCTL_BACKEND", "gloo")  # inherited by the spawned ranks
    results = run_ranks(2, [], tmp_path, setup_only=True, fake_probe={"0": GPU, "1": GPU})
    assert [(r["backend"], r["why"]) for r in results] == [("gloo", "gloo requested")] * 2
