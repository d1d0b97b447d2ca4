"""Low-communication training and unequal shares, on real processes over gloo: DiLoCo's outer step,
its exact resume and NaN agreement, DDP's compression hooks, and per-node shares of the batch."""

from __future__ import annotations

import json

import pytest
import torch

from auralm.parallel.compress import bytes_per_value
from auralm.planning.link_budget import PAPER_STEP
from tests.trainer.helpers import records, run_ranks, tiny_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(1200)


@pytest.fixture(scope="module")
def quijote(quijote_data):
    return quijote_data(512, 40000)


def _ok(results):
    assert all(r["exit"] == 0 for r in results), [r.get("traceback") for r in results]
    return results


def _equal_weights(a: dict, b: dict) -> bool:
    return all(torch.equal(t, b[k]) for k, t in a.items())


def _jobs(*nodes: str) -> list[dict]:
    return [{"HRMCTL_JOB": f"run/{n}"} for n in nodes]


def test_unequal_shares_give_the_gradient_of_one_process_on_the_union_of_the_batches(quijote, tmp_path):
    # text: every row has the same number of targets, so the mean over rows is the mean over the batch
    # (sudoku's loss is a mean over its blank cells: its shares weigh rows, as DDP's own average does)
    common = ["training.max_steps=1", "training.grad_clip=0", "task=lm", f"data_dir={quijote}", "training.dtype=fp32"]
    two = _ok(run_ranks(2, tiny_args(quijote, tmp_path / "two", *common, "training.balance=node0:2,node1:1"),
                        tmp_path / "r2", env=_jobs("node0", "node1")))
    one = _ok(run_ranks(1, tiny_args(quijote, tmp_path / "one", *common, "training.batch_size=32"),
                        tmp_path / "r1"))
    assert [len(r["seen"]) for r in two] == [21, 11]  # 2:1 of the global batch of 2 x 16
    assert set(two[0]["seen"]).isdisjoint(two[1]["seen"])
    assert set(two[0]["seen"]) | set(two[1]["seen"]) == set(one[0]["seen"])
    g1, g2 = one[0]["first_grads"], two[0]["first_grads"]
    assert g1.keys() == g2.keys() and len(g1) > 3
    for i in g1:
        torch.testing.assert_close(g2[i], g1[i], rtol=1e-5, atol=1e-6)
    events = [e for e in records(tmp_path / "two", "events.jsonl") if e["kind"] == "balance"]
    assert events and events[0]["batch"] == [21, 11] and "rank 1 (node1): weight 0.5" not in events[0]["message"]
    assert "rank 1 (node1): weight 1 -> 11 rows" in events[0]["message"]


def test_diloco_default_outer_step_on_a_short_run_is_the_average_of_the_ranks_weights(sudoku_dir, tmp_path, capfd):
    # one round: fewer than FEW_ROUNDS, so the default (training.diloco.outer_lr=auto) takes lr 1 and no momentum
    args = tiny_args(sudoku_dir, tmp_path / "run", "training.max_steps=4", "training.sync=diloco",
                     "training.diloco.inner_steps=4", "training.diloco.compress=none", "training.eval_interval=0")
    r0, r1 = _ok(run_ranks(2, args, tmp_path, spy_sync=True))
    assert ("outer step: the ranks' plain average (lr 1, momentum 0), chosen by training.diloco.outer_lr=auto for "
            "1 round(s) of 4 local steps (fewer than 20") in capfd.readouterr().out  # the ranks' stdout
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["training"]["diloco"]
    assert (saved["outer_lr"], saved["outer_momentum"]) == (1.0, 0.0)  # the run's record has the values chosen
    assert r0["optimizer_steps"] == r1["optimizer_steps"] == 4 + 1  # 4 local steps, 1 outer step
    assert _equal_weights(r0["state"], r1["state"])
    local0, local1 = r0["synced"][0], r1["synced"][0]
    assert not all(torch.equal(a, b) for a, b in zip(local0, local1))  # each rank trained on its own data
    names = [n for n, t in r0["state"].items() if t.is_floating_point() and t.requires_grad is False]
    params = [r0["state"][n] for n in names][:len(local0)]
    expected = [(a + b) / 2 for a, b in zip(local0, local1)]
    for got, want in zip(params, expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_diloco_nesterov_outer_step_matches_its_formula_in_one_process(sudoku_dir, tmp_path):
    # one rank: the pseudo-gradient is the rank's own change d; Nesterov SGD's first step moves by lr * (1 + m) * d
    args = tiny_args(sudoku_dir, tmp_path / "run", "training.max_steps=3", "training.sync=diloco",
                     "training.diloco.inner_steps=3", "training.diloco.compress=none", *PAPER_STEP)
    (r,) = _ok(run_ranks(1, args, tmp_path, spy_sync=True))
    before = r["first_grads"]  # only to know the parameter count
    assert len(before) == len(r["synced"][0])
    torch.manual_seed(1337)
    from auralm import models
    from auralm.training import config

    start = [p.detach() for p in models.build("sudoku", config.resolved_model(config.parse(args).model), None)
             .parameters()]
    final = [t for t in r["state"].values()][:len(start)]
    for s, local, got in zip(start, r["synced"][0], final):
        torch.testing.assert_close(got, s - 0.7 * 1.9 * (s - local), rtol=1e-4, atol=1e-6)


def test_diloco_resumes_exactly_with_every_ranks_inner_optimizer_and_the_outer_momentum(sudoku_dir, tmp_path):
    common = ["training.max_steps=20", "training.sync=diloco", "training.diloco.inner_steps=5",
              "training.checkpoint_interval=10", "training.log_interval=5", *PAPER_STEP]  # a momentum to resume
    straight = _ok(run_ranks(2, tiny_args(sudoku_dir, tmp_path / "a", *common), tmp_path / "ra"))
    assert (tmp_path / "a" / "checkpoint-10" / "diloco.pt").exists()
    assert (tmp_path / "a" / "checkpoint-10" / "inner_optimizer.pt").exists()
    resumed = _ok(run_ranks(2, tiny_args(sudoku_dir, tmp_path / "b", *common,
                                         f"resume={tmp_path / 'a' / 'checkpoint-10'}"), tmp_path / "rb"))
    assert resumed[0]["optimizer_steps"] == 10 + 2
    for a, b in zip(straight, resumed):
        assert _equal_weights(a["state"], b["state"])
    assert [r["loss"] for r in records(tmp_path / "b")] == [r["loss"] for r in records(tmp_path / "a")][-2:]


def test_diloco_with_overlap_keeps_the_ranks_equal_resumes_exactly_and_says_so(sudoku_dir, tmp_path, capfd):
    common = ["training.max_steps=20", "training.sync=diloco", "training.diloco.inner_steps=5",
              "training.diloco.overlap_steps=2", "training.checkpoint_interval=10", "training.log_interval=5"]
    straight = _ok(run_ranks(2, tiny_args(sudoku_dir, tmp_path / "a", *common), tmp_path / "ra"))
    assert _equal_weights(straight[0]["state"], straight[1]["state"])  # the last round finished before the end
    assert straight[0]["optimizer_steps"] == 20 + 4  # 20 local steps, 4 outer steps
    resumed = _ok(run_ranks(2, tiny_args(sudoku_dir, tmp_path / "b", *common,
                                         f"resume={tmp_path / 'a' / 'checkpoint-10'}"), tmp_path / "rb"))
    for a, b in zip(straight, resumed):
        assert _equal_weights(a["state"], b["state"])
    losses = [r["loss"] for r in records(tmp_path / "a")]
    assert len(losses) == 4 and all(v is not None for v in losses)
    assert [r["loss"] for r in records(tmp_path / "b")] == losses[-2:]
    waiting = _ok(run_ranks(2, tiny_args(sudoku_dir, tmp_path / "c", *common[:3], "training.checkpoint_interval=10",
                                         "training.log_interval=5"), tmp_path / "rc"))
    assert not _equal_weights(waiting[0]["state"], straight[0]["state"])  # the overlapped steps began earlier
    assert "overlaps the next round's first 2 local steps" in capfd.readouterr().out  # the ranks' stdout


@pytest.mark.parametrize("kind, ranks", [("int8", 2), ("int4", 3)])
def test_quantised_rounds_keep_the_ranks_equal_resume_exactly_and_stay_near_fp32(sudoku_dir, tmp_path, capfd, kind,
                                                                                ranks):
    """int8 (two ranks) and int4 (three: owners of unequal slices of the blocks) through the real all-to-all and
    all-gather, with overlap: every rank ends with the same weights, a resume from a checkpoint (each rank's
    remainder in it) ends with the straight run's, and the weights stay near those of the same run sent in fp32.
    The steps compute in fp32 whatever the CPU: with dtype=auto a CPU with AMX computes in bf16, whose rounding (a
    relative 4e-3) magnifies the wire's differences past the bound (1.3e-3 of the weights on a Xeon with AMX,
    2026-12-07), so the figure would measure the CPU rather than the wire."""
    common = ["training.max_steps=20", "training.sync=diloco", "training.diloco.inner_steps=5",
              "training.diloco.overlap_steps=1", "training.checkpoint_interval=10", "training.log_interval=5",
              "training.dtype=fp32"]
    straight = _ok(run_ranks(ranks, tiny_args(sudoku_dir, tmp_path / "a", *common,
                                              f"training.diloco.compress={kind}"), tmp_path / "ra"))
    assert all(_equal_weights(straight[0]["state"], r["state"]) for r in straight[1:])
    assert (tmp_path / "a" / "checkpoint-10" / "diloco_remainder.pt").exists()
    out = capfd.readouterr().out
    assert f"the change of the weights quantised to {kind} (blocks of 256, the rounding's remainder carried to the " \
           "next round) and reduce-scattered and all-gathered as codes" in out and "sent by each rank a round (" in out, out
    resumed = _ok(run_ranks(ranks, tiny_args(sudoku_dir, tmp_path / "b", *common, f"training.diloco.compress={kind}",
                                             f"resume={tmp_path / 'a' / 'checkpoint-10'}"), tmp_path / "rb"))
    for a, b in zip(straight, resumed):
        assert _equal_weights(a["state"], b["state"])
    plain = _ok(run_ranks(ranks, tiny_args(sudoku_dir, tmp_path / "c", *common, "training.diloco.compress=none"),
                          tmp_path / "rc"))
    weights = [k for k, t in plain[0]["state"].items() if t.is_floating_point()]
    drift = max(float((straight[0]["state"][k] - plain[0]["state"][k]).abs().max()) for k in weights)
    moved = max(float(plain[0]["state"][k].abs().max()) for k in weights)
    assert 0 < drift < 1e-3 * moved, (drift, moved)  # 1e-5 (int8) and 1e-4 (int4) of it, 2026-12-06
    sent, fp32 = ([r["round_bytes"] for r in records(tmp_path / run)] for run in ("a", "c"))
    assert sent[-1] > 0 and sent[-1] / fp32[-1] == pytest.approx(bytes_per_value(kind) / 4, rel=0.02), (sent, fp32)
    losses = [r["loss"] for r in records(tmp_path / "a")]
    assert losses[-1] == pytest.approx([r["loss"] for r in records(tmp_path / "c")][-1], rel=0.05)


@pytest.mark.parametrize("overlap", [0, 2])
def test_a_nan_in_diloco_is_agreed_at_the_round_and_restores_rank_0s_weights_everywhere(sudoku_dir, tmp_path,
                                                                                          overlap):
    # with overlap the round's verdict arrives two local steps into the next round; it is reported at the
    # round's end all the same
    args = tiny_args(sudoku_dir, tmp_path / "run", "training.max_steps=15", "training.sync=diloco",
                     "training.diloco.inner_steps=5", "fault.nan_at_step=7,8,9", "fault.nan_rank=1",
                     "guard.snapshot_every=5", f"training.diloco.overlap_steps={overlap}")
    r0, r1 = _ok(run_ranks(2, args, tmp_path))
    assert _equal_weights(r0["state"], r1["state"])
    assert r1["optimizer_steps"] == 15 - 3 + 3 and r0["optimizer_steps"] == 15 + 3  # rank 1 skipped 3 local steps
    events = records(tmp_path / "run", "events.jsonl")
    skip = [e for e in events if e["kind"] == "nan_skip"]
    assert len(skip) == 1 and skip[0]["step"] == 10 and "rank 1 skipped 3 local steps" in skip[0]["message"]
    rec = [e for e in events if e["kind"] == "recovery"]
    assert len(rec) == 1 and rec[0]["step"] == 10 and rec[0]["equal"] and rec[0]["restored_step"] == 5
    assert all(r["loss"] is not None for r in records(tmp_path / "run"))


@pytest.fixture(scope="module")
def plain_ddp_run(sudoku_dir, tmp_path_factory):
    """The plain DDP run that each compression hook's run is compared with (the same steps, made once)."""
    tmp = tmp_path_factory.mktemp("plain")
    plain = _ok(run_ranks(2, tiny_args(sudoku_dir, tmp / "c", "training.max_steps=12", "training.warmup_steps=2",
                                       "model.n_embd=64"), tmp / "rc"))
    assert _equal_weights(plain[0]["state"], plain[1]["state"])  # DDP without accumulation (test_ddp.py: with)
    return plain


@pytest.mark.parametrize("hook", ["bf16", "powersgd"])
def test_ddp_compression_hooks_keep_the_ranks_equal_and_resume(sudoku_dir, tmp_path, hook, plain_ddp_run):
    common = ["training.max_steps=12", f"training.ddp_comm_hook={hook}", "training.checkpoint_interval=6",
              "training.warmup_steps=2", "model.n_embd=64"]
    straight = _ok(run_ranks(2, tiny_args(sudoku_dir, tmp_path / "a", *common), tmp_path / "ra"))
    assert _equal_weights(straight[0]["state"], straight[1]["state"])
    resumed = _ok(run_ranks(2, tiny_args(sudoku_dir, tmp_path / "b", *common,
                                         f"resume={tmp_path / 'a' / 'checkpoint-6'}"), tmp_path / "rb"))
    assert _equal_weights(resumed[0]["state"], resumed[1]["state"])
    # exact for both: bf16 has no state, PowerSGD's (each rank's error feedback and factors) is in the checkpoint
    assert _equal_weights(straight[0]["state"], resumed[0]["state"])
    if hook == "powersgd":
        assert (tmp_path / "a" / "checkpoint-6" / "powersgd.pt").is_file()
    assert not _equal_weights(plain_ddp_run[0]["state"], straight[0]["state"])  # the hook changed what was sent
    first = records(tmp_path / "a")[0]["loss"]
    assert records(tmp_path / "a")[-1]["loss"] < first


def test_auto_balance_measures_each_rank_and_diloco_gives_the_slower_rank_fewer_local_steps(sudoku_dir, tmp_path):
    args = tiny_args(sudoku_dir, tmp_path / "run", "training.max_steps=10", "training.sync=diloco",
                     "training.diloco.inner_steps=10", "training.balance=auto")
    r0, r1 = _ok(run_ranks(2, args, tmp_path, env=_jobs("fast", "slow")))
    (event,) = [e for e in records(tmp_path / "run", "events.jsonl") if e["kind"] == "balance"]
    assert event["how"] == "auto" and all(w > 0 for w in event["weights"]) and event["nodes"] == ["fast", "slow"]
    assert [r0["optimizer_steps"] - 1, r1["optimizer_steps"] - 1] == event["inner_steps"]
    assert max(event["inner_steps"]) == 10
    assert _equal_weights(r0["state"], r1["state"])


def test_rounds_by_time_give_a_rank_slowed_mid_run_fewer_local_steps_and_weigh_the_average_by_rows(sudoku_dir,
                                                                                                   tmp_path, capfd):
    """training.diloco.inner_steps=auto (here with H=10): the first round, nothing measured, every rank takes H;
    from step 11 rank 1 sleeps 0.3 s a step (a laptop that slowed), so in the next rounds, each as long as rank 0's
    last H steps, it takes fewer than rank 0, which takes about H: the round no longer waits for H slow steps. The
    outer average (plain, one lr 1 step: fewer than 20 rounds) weighs each rank's weights by its rows. Whatever this
    machine's speed: rank 1's steps are 0.3 s longer than rank 0's, so fewer of them fit a round of rank 0's."""
    args = tiny_args(sudoku_dir, tmp_path / "run", "training.max_steps=30", "training.sync=diloco",
                     "training.diloco.inner_steps=10", "training.diloco.timed=true", "training.diloco.compress=none",
                     "training.eval_interval=0", "training.log_interval=10", "fault.step_sleep=0.3",
                     "fault.sleep_rank=1", "fault.sleep_from_step=11")
    r0, r1 = _ok(run_ranks(2, args, tmp_path, spy_sync=True))
    assert "rounds by time (training.diloco.inner_steps=auto" in capfd.readouterr().out
    steps = [rec["round_steps"] for rec in records(tmp_path / "run")]
    assert steps[0] == [10, 10], steps  # nothing measured yet: the shares' H each
    for r0_steps, r1_steps in steps[1:]:
        assert r1_steps < r0_steps <= 20, steps  # at most 2H
    assert [r0["optimizer_steps"], r1["optimizer_steps"]] == [sum(s[0] for s in steps) + 3,
                                                             sum(s[1] for s in steps) + 3]  # 3 outer steps each
    assert _equal_weights(r0["state"], r1["state"])
    n0, n1 = steps[-1]
    final = [t for t in r0["state"].values()][:len(r0["synced"][-1])]
    for got, a, b in zip(final, r0["synced"][-1], r1["synced"][-1]):
        torch.testing.assert_close(got, (n0 * a + n1 * b) / (n0 + n1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind, ranks, overlap", [("bf16", 2, 0), ("int8", 3, 1)])
def test_fragments_send_a_part_at_a_time_keep_the_ranks_equal_and_resume_exactly(sudoku_dir, tmp_path, capfd, kind,
                                                                                  ranks, overlap):
    """training.diloco.fragments=2 (Streaming DiLoCo's): the weights in two parts of about equal size, each sent once
    a round (the first after half the round's local steps, the second at its end), through the real collectives (int8:
    the all-to-all and all-gather, three ranks, with overlap); a checkpoint sends the first part again so that every
    rank holds the shared weights: the ranks end equal, a resume from it ends with the straight run's weights, each
    sending carries about half of the whole model's bytes, and the run learns as the unfragmented one does."""
    common = ["training.max_steps=20", "training.sync=diloco", "training.diloco.inner_steps=6",
              f"training.diloco.overlap_steps={overlap}", "training.checkpoint_interval=12", "training.log_interval=6",
              f"training.diloco.compress={kind}", "training.eval_interval=0"]
    straight = _ok(run_ranks(ranks, tiny_args(sudoku_dir, tmp_path / "a", *common, "training.diloco.fragments=2"),
                             tmp_path / "ra", spy_sync=True))
    assert all(_equal_weights(straight[0]["state"], r["state"]) for r in straight[1:])
    out = capfd.readouterr().out
    assert " in 2 parts of about " in out and "each sent after its share of the round's local steps" in out, out
    # what was sent, in order: part 0 then part 1 each round (rounds end at 6, 12, 18, 20), and part 0 again at the
    # checkpoint (12) and at the end (20): a part's tensors, never the whole model's
    sizes = [sum(t.numel() for t in sent) for sent in straight[0]["synced"]]
    whole = sum(t.numel() for t in straight[0]["first_grads"].values())
    assert len(set(sizes)) == 2 and sum(set(sizes)) == whole and max(sizes) < 0.75 * whole, (sizes, whole)
    first, second = sizes[0], sizes[1]
    assert sizes == [first, second, first, second, first, first, second, first, second, first], sizes
    resumed = _ok(run_ranks(ranks, tiny_args(sudoku_dir, tmp_path / "b", *common, "training.diloco.fragments=2",
                                             f"resume={tmp_path / 'a' / 'checkpoint-12'}"), tmp_path / "rb"))
    for a, b in zip(straight, resumed):
        assert _equal_weights(a["state"], b["state"])
    if ranks == 2:  # resumed in one part: refused in one line, naming the setting that fits the checkpoint
        refused = run_ranks(ranks, tiny_args(sudoku_dir, tmp_path / "d", *common,
                                             f"resume={tmp_path / 'a' / 'checkpoint-12'}"), tmp_path / "rd")
        assert all(r["exit"] != 0 and "resume with training.diloco.fragments=2" in r["error"] for r in refused)
    whole_run = _ok(run_ranks(ranks, tiny_args(sudoku_dir, tmp_path / "c", *common), tmp_path / "rc"))
    assert not _equal_weights(whole_run[0]["state"], straight[0]["state"])  # the parts' points differ from the round's
    sent, once = ([r["round_bytes"] for r in records(tmp_path / run)] for run in ("a", "c"))
    assert sent[-1] == pytest.approx(once[-1], rel=0.05), (sent, once)  # the parts' last sendings: the whole model's
    losses, plain = ([r["loss"] for r in records(tmp_path / run)] for run in ("a", "c"))
    assert losses[-1] < losses[0] and losses[-1] == pytest.approx(plain[-1], rel=0.05), (losses, plain)
