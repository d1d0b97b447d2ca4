"""The NaN guard across real ranks: one bad rank makes every rank skip; repeats restore by broadcast."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.helpers import by_step, records, run_ranks, tiny_args

pytestmark = pytest.mark.slow


def _same_weights(results):
    return all(torch.equal(t, r["state"][name]) for r in results[1:] for name, t in results[0]["state"].items())


def test_a_nan_on_one_rank_makes_all_three_ranks_skip_that_step(tmp_path, sudoku_data):
    sudoku = sudoku_data(1200)
    run = tmp_path / "run"
    results = run_ranks(3, tiny_args(sudoku, run, "training.max_steps=6", "fault.nan_at_step=4", "fault.nan_rank=2"),
                        tmp_path)
    assert all(r["exit"] == 0 for r in results), [r.get("traceback") for r in results]
    assert [r["optimizer_steps"] for r in results] == [5, 5, 5]  # step 4 skipped everywhere
    assert _same_weights(results)
    skips = [e for e in records(run, "events.jsonl") if e["kind"] == "nan_skip"]
    assert [(e["step"], e["rank"]) for e in skips] == [(4, [2])]
    assert "non-finite gradients on rank 2; update skipped on all 3 ranks" in skips[0]["message"]
    assert by_step(run)[4]["loss"] is None and by_step(run)[5]["loss"] > 0


@pytest.fixture(scope="module")
def quijote(quijote_data):
    return quijote_data(512, 40000)


def test_repeated_nans_restore_rank_0s_state_on_every_rank_and_training_recovers(quijote, tmp_path):
    common = ["task=lm", f"data_dir={quijote}", "model=tiny", "training.batch_size=8", "training.max_steps=40",
              "logging.curves=false",
              "training.lr=1e-2", "training.warmup_steps=5", "training.log_interval=1", "training.eval_interval=0",
              "training.checkpoint_interval=0", "guard.snapshot_every=5", "guard.max_bad=3", "guard.lr_steps=10"]
    clean = run_ranks(2, common + [f"out_dir={tmp_path / 'clean'}"], tmp_path / "r-clean")
    hurt = run_ranks(2, common + [f"out_dir={tmp_path / 'hurt'}", "fault.nan_at_step=12-14", "fault.nan_rank=1"],
                     tmp_path / "r-hurt")
    assert all(r["exit"] == 0 for r in clean + hurt), [r.get("traceback") for r in clean + hurt]
    events = records(tmp_path / "hurt", "events.jsonl")
    assert [(e["kind"], e["step"]) for e in events if e["kind"] in ("nan_skip", "recovery")] == [
        ("nan_skip", 12), ("nan_skip", 13), ("nan_skip", 14), ("recovery", 14)]
    recovery = next(e for e in events if e["kind"] == "recovery")
    assert recovery["restored_step"] == 10 and recovery["equal"] and len(set(recovery["checksums"])) == 1
    assert recovery["lr_low_until"] == 24
    assert _same_weights(hurt)
    assert [r["optimizer_steps"] for r in hurt] == [37, 37]
    # The lr is lowered after the recovery, then back on the schedule.
    h, c = by_step(tmp_path / "hurt"), by_step(tmp_path / "clean")
    assert h[20]["lr"] == pytest.approx(c[20]["lr"] * 0.5) and h[30]["lr"] == c[30]["lr"]
    # Later, the loss is where an uninjected run's is (mean of the last steps, within 5%).
    late = range(36, 41)
    hurt_loss, clean_loss = (sum(m[s]["loss"] for s in late) / len(late) for m in (h, c))
    assert clean_loss < c[1]["loss"] - 0.5  # the comparison is made while the loss is really moving
    assert abs(hurt_loss - clean_loss) / clean_loss < 0.05
