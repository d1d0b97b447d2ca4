"""training.parallel=fsdp on real gloo ranks: the same losses as DDP with half the parameters per rank, sharded
checkpoints that resume exactly at the same world size and onto other world sizes (2 -> 1 -> 3), the NaN guard's
recovery from each rank's own shards, and `hrmctl export` gathering a checkpoint into one loadable model; the
recurrent HRM and TRM under torchrun: train, evaluate on their shards, save, resume exactly, and `hrmctl
eval`/`solve`/`export` on their sharded checkpoints."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from auralm.data import datadir
from auralm import tasks
from auralm.training import checkpoint, config
from auralm.errors import UserError
from tests.trainer.helpers import PYTHON, by_step, python_env, records, run_ranks, tiny_args

pytestmark = pytest.mark.slow

STEPS = 8


@pytest.fixture(scope="module")
def sudoku_dir(sudoku_data):
    return sudoku_data(600)


def _args(sudoku_dir, out, *extra):
    return tiny_args(sudoku_dir, out, f"training.max_steps={STEPS}", "training.dtype=fp32", *extra)


def _ok(results):
    assert all(r["exit"] == 0 for r in results), [r.get("traceback") for r in results]
    return results


@pytest.fixture(scope="module")
def fsdp_run(sudoku_dir, tmp_path_factory):
    """Two fsdp ranks, 8 steps, a sharded checkpoint at steps 4 and 8."""
    tmp = tmp_path_factory.mktemp("fsdp")
    results = _ok(run_ranks(2, _args(sudoku_dir, tmp / "run", "training.parallel=fsdp",
                                     "training.checkpoint_interval=4"), tmp / "ranks"))
    return tmp / "run", results


def _same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _export(ckpt, out):
    from auralm.models import Pretrained
    from cli.app import main

    assert main(["export", str(ckpt), "--out", str(out)]) == 0
    return Pretrained.from_pretrained(out)


def test_fsdp_losses_match_ddp_with_about_half_the_parameters_per_rank(sudoku_dir, fsdp_run, tmp_path):
    run, results = fsdp_run
    ddp = _ok(run_ranks(2, _args(sudoku_dir, tmp_path / "ddp"), tmp_path / "ranks"))
    f, d = by_step(run), by_step(tmp_path / "ddp")
    assert sorted(f) == sorted(d) == list(range(1, STEPS + 1))
    for s in range(1, STEPS + 1):
        assert f[s]["loss"] == pytest.approx(d[s]["loss"], rel=1e-5, abs=1e-6), s
    assert f[STEPS]["loss"] < f[1]["loss"]
    for name, t in ddp[0]["state"].items():  # the trained weights too, all-gathered from the shards
        assert torch.allclose(results[0]["state"][name], t, atol=1e-5), name
    event = next(e for e in records(run, "events.jsonl") if e["kind"] == "fsdp")
    assert sum(event["local_params"]) == event["params"]
    assert max(event["local_params"]) <= 0.55 * event["params"]  # DDP: every rank holds all of them
    assert "blocks and the root sharded" in event["message"]
    final = next(e for e in records(run, "events.jsonl") if e["kind"] == "checksum")
    assert final["equal"]


def test_gpt_on_text_with_accumulation_matches_ddp(tmp_path, capfd, quijote_data):
    text = quijote_data(512, 20000)
    common = ["task=lm", f"data_dir={text}", "model=tiny", "training.batch_size=4", "training.grad_accum=2",
              "logging.curves=false",
              "training.max_steps=4", "training.dtype=fp32", "training.log_interval=1", "training.eval_interval=0",
              "training.checkpoint_interval=0", "training.warmup_steps=2", "training.sample_tokens=6"]
    samples = {}  # rank 0's "sample: ..." lines (the ranks' stdout is this process's)
    capfd.readouterr()
    _ok(run_ranks(2, common + [f"out_dir={tmp_path / 'ddp'}"], tmp_path / "r-ddp"))
    samples["ddp"] = [line for line in capfd.readouterr().out.splitlines() if line.startswith("sample: ")]
    _ok(run_ranks(2, common + [f"out_dir={tmp_path / 'fsdp'}", "training.parallel=fsdp",
                               "training.fsdp_cpu_offload=true"], tmp_path / "r-fsdp"))
    samples["fsdp"] = [line for line in capfd.readouterr().out.splitlines() if line.startswith("sample: ")]
    f, d = by_step(tmp_path / "fsdp"), by_step(tmp_path / "ddp")
    assert sorted(f) == sorted(d) == [1, 2, 3, 4]
    for s in f:
        assert f[s]["loss"] == pytest.approx(d[s]["loss"], rel=1e-5), s
    # the final evaluation, run by both ranks on their shards, gives DDP's figures and DDP's text sample
    assert f[4]["val_loss"] == pytest.approx(d[4]["val_loss"], rel=1e-5)
    assert samples["fsdp"] == samples["ddp"] and len(samples["ddp"]) == 1, samples
    event = next(e for e in records(tmp_path / "fsdp", "events.jsonl") if e["kind"] == "fsdp")
    assert "2 blocks and the root sharded, fp32" in event["message"]
    assert "fsdp_cpu_offload=true changes nothing on the CPU" in event["message"]


def test_sharded_checkpoint_layout_and_checksums(fsdp_run):
    run, _ = fsdp_run
    assert [checkpoint.step_of(c) for c in checkpoint.list_checkpoints(run)] == [8, 4]
    ckpt = run / "checkpoint-8"
    names = {p.name for p in (ckpt / "dcp").iterdir()}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= names
    assert not (ckpt / "model.safetensors").exists() and checkpoint.problem(ckpt) is None
    assert not list(run.glob(".checkpoint-*"))
    with open(ckpt / "dcp" / "__1_0.distcp", "r+b") as f:  # one rank's shard changed: the checkpoint is refused
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    try:
        assert "dcp/__1_0.distcp does not match its checksum" in checkpoint.problem(ckpt)
    finally:
        with open(ckpt / "dcp" / "__1_0.distcp", "r+b") as f:
            f.seek(100)
            f.write(byte)


def test_resume_at_the_same_world_is_exact(sudoku_dir, fsdp_run, tmp_path):
    run, results = fsdp_run
    resumed = _ok(run_ranks(2, _args(sudoku_dir, tmp_path / "resumed", "training.parallel=fsdp",
                                     f"resume={run / 'checkpoint-4'}"), tmp_path / "ranks"))
    assert _same_state(resumed[0]["state"], results[0]["state"])
    again, first = by_step(tmp_path / "resumed"), by_step(run)
    assert sorted(again) == [5, 6, 7, 8]
    assert [again[s]["loss"] for s in again] == [first[s]["loss"] for s in again]


def test_a_ddp_run_resumes_from_a_sharded_checkpoint(sudoku_dir, fsdp_run, tmp_path):
    run, results = fsdp_run
    ddp = _ok(run_ranks(2, _args(sudoku_dir, tmp_path / "ddp", f"resume={run / 'checkpoint-4'}"), tmp_path / "r"))
    assert sorted(by_step(tmp_path / "ddp")) == [5, 6, 7, 8]
    assert (tmp_path / "ddp" / "checkpoint-8" / "model.safetensors").exists()
    for name, t in results[0]["state"].items():  # DDP's all-reduce and FSDP's reduce-scatter: the same sums
        assert torch.allclose(ddp[0]["state"][name], t, atol=1e-5), name


def test_resume_onto_one_rank_then_three_reshards_and_export_gathers_the_model(sudoku_dir, fsdp_run, tmp_path):
    run, results = fsdp_run
    # 2 -> 1: a whole model in one process, no process group; its checkpoints are still DCP
    _ok(run_ranks(1, _args(sudoku_dir, tmp_path / "one", "training.parallel=fsdp",
                           "training.checkpoint_interval=2", f"resume={run / 'checkpoint-4'}"),
                  tmp_path / "r1"))
    assert sorted(by_step(tmp_path / "one")) == [5, 6, 7, 8]
    assert checkpoint.is_sharded(tmp_path / "one" / "checkpoint-6")
    # 1 -> 3: loaded exactly as written (max_steps reached: nothing to train, the model as loaded)
    three = _ok(run_ranks(3, _args(sudoku_dir, tmp_path / "three", "training.parallel=fsdp",
                                   "training.max_steps=6", f"resume={tmp_path / 'one' / 'checkpoint-6'}"),
                          tmp_path / "r3"))
    six = _export(tmp_path / "one" / "checkpoint-6", tmp_path / "six")
    for r in three:
        assert _same_state(r["state"], six.state_dict())
    # ... and training goes on on three ranks from there
    _ok(run_ranks(3, _args(sudoku_dir, tmp_path / "three", "training.parallel=fsdp",
                           f"resume={tmp_path / 'one' / 'checkpoint-6'}"), tmp_path / "r3b"))
    late = by_step(tmp_path / "three")
    assert sorted(late) == [7, 8] and all(late[s]["loss"] < by_step(run)[1]["loss"] for s in late)
    # export: one model.safetensors + config.yaml with the trained weights, the same outputs
    model = _export(run / "checkpoint-8", tmp_path / "export")
    assert {p.name for p in (tmp_path / "export").iterdir()} == {"model.safetensors", "config.yaml", "checksums.json"}
    assert _same_state(model.state_dict(), results[0]["state"])
    from auralm import models

    trained = models.build("sudoku", config.resolved_model(config.parse(["model=tiny"]).model))
    trained.load_state_dict(results[0]["state"])
    x = torch.randint(0, 10, (4, 81))
    with torch.no_grad():
        assert torch.equal(model(x)[0], trained.eval()(x)[0])


def test_nan_guard_restores_every_ranks_own_shards(sudoku_dir, fsdp_run, tmp_path):
    run, _ = fsdp_run
    hurt = _ok(run_ranks(2, _args(sudoku_dir, tmp_path / "hurt", "training.parallel=fsdp", "guard.snapshot_every=4",
                                  "guard.max_bad=3", "fault.nan_at_step=6-8", "fault.nan_rank=1"), tmp_path / "ranks"))
    events = records(tmp_path / "hurt", "events.jsonl")
    assert [(e["kind"], e["step"], e["rank"]) for e in events if e["kind"] in ("nan_skip", "recovery")] == [
        ("nan_skip", 6, [1]), ("nan_skip", 7, [1]), ("nan_skip", 8, [1]), ("recovery", 8, 0)]
    recovery = next(e for e in events if e["kind"] == "recovery")
    assert recovery["restored_step"] == 4 and recovery["equal"]
    assert "restored its own shards" in recovery["message"]
    # the weights after the recovery at the last step are those of step 4, which the clean run saved
    four = _export(run / "checkpoint-4", tmp_path / "four")
    for r in hurt:
        assert _same_state(r["state"], four.state_dict())


@pytest.mark.parametrize("extra", ["training.sync=diloco", "training.ddp_comm_hook=bf16"])
def test_fsdp_with_diloco_or_a_comm_hook_is_one_clear_error(extra):
    with pytest.raises(UserError, match=r"training.parallel=fsdp cannot be combined with training\."):
        config.parse(["training.parallel=fsdp", extra])


# the recurrent families at their smallest: one layer per level, width 32
RECURRENT = {"hrm": ["model=hrm-tiny", "model.n_embd=32", "model.n_head=2", "model.H_layers=1", "model.L_layers=1"],
             "trm": ["model=trm-tiny", "model.n_embd=32", "model.n_head=2", "model.L_layers=1"]}


def _torchrun(args: list[str], cwd) -> subprocess.CompletedProcess:
    """``auralm.training.train`` on two ranks under a real torchrun (gloo, CPU)."""
    res = subprocess.run([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
                          "auralm.training.train", *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                         env=python_env(HRMCTL_BACKEND="gloo"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


@pytest.mark.parametrize("family", sorted(RECURRENT))
def test_recurrent_families_train_evaluate_save_and_resume_exactly_under_torchrun(sudoku_dir, tmp_path, family,
                                                                                  capsys):
    """HRM and TRM have one FSDP unit (the root) and are evaluated through ``solve``, not ``forward``: every rank
    evaluates on its shards at steps 2 and 4, the checkpoints are sharded, a resume from step 2 repeats steps 3
    and 4 exactly, and the tools read the sharded checkpoint whole in one process, with the run's figures."""
    common = [*RECURRENT[family], "training.parallel=fsdp", "training.batch_size=8", "training.eval_interval=2",
              "training.eval_batches=1", "training.checkpoint_interval=2"]
    run, resumed = tmp_path / "run", tmp_path / "resumed"
    first = _torchrun(_args(sudoku_dir, run, *common, "training.max_steps=4"), tmp_path)
    assert "fsdp: the whole model as one unit sharded, fp32" in first.stdout
    _torchrun(_args(sudoku_dir, resumed, *common, "training.max_steps=4", f"resume={run / 'checkpoint-2'}"),
              tmp_path)
    a, b = by_step(run), by_step(resumed)
    assert sorted(a) == [1, 2, 3, 4] and sorted(b) == [3, 4]
    assert "exact_accuracy" in a[2] and "exact_by_segments" in a[4]  # the evaluations ran, on both ranks' shards
    for s in (3, 4):
        assert b[s]["loss"] == a[s]["loss"], s
    assert b[4]["val_loss"] == a[4]["val_loss"] and b[4]["exact_accuracy"] == a[4]["exact_accuracy"]
    assert all(checkpoint.is_sharded(run / f"checkpoint-{s}") for s in (2, 4))
    assert _same_state(_export(run / "checkpoint-4", tmp_path / "a").state_dict(),
                       _export(resumed / "checkpoint-4", tmp_path / "b").state_dict())
    # hrmctl eval: the whole model in one process gives the figures of the run's final evaluation (all of val)
    from cli.app import main

    capsys.readouterr()
    assert main(["eval", str(run / "checkpoint-4"), "--batch-size", "8", "--json"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["val_loss"] == pytest.approx(a[4]["val_loss"], rel=1e-5)
    assert ev["exact_by_segments"] == a[4]["exact_by_segments"] and ev["cell_acc"] == pytest.approx(a[4]["cell_acc"])
    # hrmctl solve: a grid per puzzle
    puzzles = tmp_path / "puzzles.txt"
    x, _ = tasks.open_split(sudoku_dir, datadir.load_manifest(sudoku_dir, "sudoku"), "val", 81).batch([0, 1])
    puzzles.write_text("".join("".join(map(str, row)) + "\n" for row in x.tolist()))
    assert main(["solve", str(run / "checkpoint-4"), str(puzzles), "--json"]) in (0, 1)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 3 and all(len(line["grid"]) == 81 for line in lines[:2]) and lines[2]["puzzles"] == 2
