"""HRM and TRM on sudoku: exact accuracy against training time, and the trainer's overhead over a bare loop.

    python bench/hrm_sudoku.py accuracy [--minutes 10] [--models trm-tiny,hrm-tiny] [--difficulty medium,extreme]
    python bench/hrm_sudoku.py overhead [--repeats 3] [--steps 40]
    python bench/hrm_sudoku.py memory [--models hrm-27m,trm-7m] [--batch 16]
    python bench/hrm_sudoku.py paper

accuracy  each model on each difficulty, from a fresh start, through `python -m auralm.training.train` (the
          trainer as torchrun starts it, here alone), with a schedule sized to ``--minutes`` of
          training from the step time of a short first run; held-out exact accuracy at each
          evaluation against the training time so far (evaluations and checkpoints not counted).
overhead  hrm-tiny through `auralm.training.train.run` against a bare loop over the same model, weights,
          batches, AdamW, lr and carry (one segment a step: forward, the Q losses, backward, clip,
          step), in lock-step, one thread, fp32; thread CPU time per step. Target: trainer/bare >= 0.97.
memory    what autograd keeps for the backward of one training segment (the activation memory), with and
          without ``training.grad_checkpoint``, counted tensor by tensor (saved-tensor hooks: exact and
          the same on any machine), and the peak RSS of a process that runs that step, each in its own process.
paper     the command that reproduces the papers' Sudoku-Extreme-1k runs on a GPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from auralm import models  # noqa: E402
from auralm.data import datadir
from auralm.planning import cpu_memory
from cli.app import main as cli_main  # hrmctl prepare-data, in this process
from auralm.training import config, optim, train
from auralm import tasks  # noqa: E402
from bench._lockstep import LockStep  # noqa: E402

DATA = {"medium": ["--difficulty", "medium", "--train", "3000", "--test", "500"],
        "extreme": ["--difficulty", "extreme", "--train", "500", "--test", "200"]}
PAPER = """# On a machine with 8 GPUs (the papers' setting; fewer GPUs: lower global_batch_size or add grad_accum).
# The data: the public Sudoku-Extreme CSVs (train.csv, test.csv), 1,000 training puzzles x 1,000 augmentations.
hrmctl prepare-data --task sudoku --preset sudoku-extreme-1k-aug-1000 --from-csv train.csv --test-csv test.csv \\
    --out data/sudoku-extreme-1k-aug-1000
# HRM (paper: 55.0% exact)
hrmctl train --nodes gpu0 model=hrm-27m data_path=data/sudoku-extreme-1k-aug-1000 epochs=20000 eval_interval=2000 \\
    global_batch_size=384 lr=7e-5 puzzle_emb_lr=7e-5 weight_decay=1.0 puzzle_emb_weight_decay=1.0 \\
    lr_warmup_steps=2000 lr_min_ratio=1.0
# TRM-MLP (paper: 87.4% exact)
hrmctl train --nodes gpu0 arch=trm model=trm-5m-mlp data_paths="[data/sudoku-extreme-1k-aug-1000]" evaluators="[]" \\
    epochs=50000 eval_interval=5000 lr=1e-4 puzzle_emb_lr=1e-4 weight_decay=1.0 puzzle_emb_weight_decay=1.0 \\
    global_batch_size=768 lr_warmup_steps=2000 lr_min_ratio=1.0 ema=True
"""


def trainer(*args: str, cwd: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "auralm.training.train", *args], cwd=cwd, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    if res.returncode:
        raise SystemExit(f"trainer failed: {res.stderr.strip().splitlines()[-1:]} ({' '.join(args)})")


def curve(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "exact_accuracy" in r]


def accuracy(a) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-hrm-"))
    table = []
    for difficulty in a.difficulty.split(","):
        data_dir = tmp / difficulty
        began = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli_main(["prepare-data", "--task", "sudoku", *DATA[difficulty], "--out", str(data_dir)]) == 0
        print(f"{difficulty}: data in {time.perf_counter() - began:.0f} s", file=sys.stderr)
        for model in a.models.split(","):
            common = [f"data_dir={data_dir}", f"model={model}", *a.overrides]
            probe = tmp / f"probe-{model}-{difficulty}"
            trainer(*common, f"out_dir={probe}", "training.max_steps=30", "training.log_interval=10",
                    "training.eval_interval=0", "training.eval_batches=1", "training.checkpoint_interval=0", cwd=tmp)
            # the step time once running: the first steps (allocator, first batches) are twice as slow
            logged = [json.loads(line)["train_s"] for line in (probe / "metrics.jsonl").read_text().splitlines()]
            per_step = (logged[-1] - logged[0]) / 20
            steps = int(a.minutes * 60 / per_step)
            run = tmp / f"run-{model}-{difficulty}"
            trainer(*common, f"out_dir={run}", f"training.max_steps={steps}", f"training.eval_interval={steps // 10}",
                    "training.eval_batches=4", "training.batch_size=64", "training.checkpoint_interval=0", cwd=tmp)
            points = curve(run)
            table.append((model, difficulty, steps, points))
            print(f"{model} {difficulty}: " + " ".join(f"{p['train_s']:.0f}s:{p['exact_accuracy']:.3f}"
                                                       for p in points), file=sys.stderr)
    print(f"\nheld-out exact accuracy against training time ({a.minutes} min budget each, this machine)")
    print(f"{'model':<10}{'difficulty':<10}{'steps':>6}  curve (training seconds: exact accuracy)")
    for model, difficulty, steps, points in table:
        print(f"{model:<10}{difficulty:<10}{steps:>6}  " + "  ".join(
            f"{p['train_s']:.0f}:{p['exact_accuracy']:.3f}" for p in points))


class BareACT:
    """One segment a step over the carry, as the trainer does it, without logging, guard or checkpoints."""

    def __init__(self, model, train_set, t: config.TrainingConfig):
        self.model, self.t = model, t
        self.opt = optim.make_optimizer(model, t, torch.device("cpu"))
        self.batches = datadir.batches(train_set, t.batch_size, 0, 1, seed=t.seed)
        self.carry, self.step_no, self.seconds = None, 0, 0.0

    def step(self, timed: bool) -> None:
        began = time.thread_time()
        self.step_no += 1
        optim.set_lr(self.opt, optim.lr_at(self.t, self.step_no))
        x, y = next(self.batches)
        y = tasks.get("sudoku").targets(x, y)
        self.carry = self.carry or self.model.initial_carry(x, y)
        self.carry, logits, q, target = self.model(self.carry, x, y)
        loss, _ = self.model.loss(self.carry, logits, q, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if timed:
            self.seconds += time.thread_time() - began


def overhead(a) -> None:
    torch.set_num_threads(1)
    cpu_memory.keep_freed_memory()
    tmp = Path(tempfile.mkdtemp(prefix="bench-hrm-overhead-"))
    data_dir = tmp / "medium"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main(["prepare-data", "--task", "sudoku", *DATA["medium"], "--out", str(data_dir)]) == 0
    meta = datadir.load_manifest(data_dir, "sudoku")
    train_set = tasks.open_split(data_dir, meta, "train", 81)
    warmup = 3
    lock = LockStep(warmup=warmup)
    ratios = []
    for r in range(a.repeats):
        cfg = config.parse([f"data_dir={data_dir}", f"out_dir={tmp / f'run{r}'}", "model=hrm-tiny",
                            "training.batch_size=32", f"training.max_steps={warmup + a.steps}", "training.dtype=fp32",
                            "training.log_interval=10", "training.eval_interval=0", "training.eval_batches=1",
                            "training.checkpoint_interval=0", "guard.snapshot_every=50"])
        torch.manual_seed(cfg.training.seed)
        bare = BareACT(models.build("sudoku", config.resolved_model(cfg.model)), train_set, cfg.training)
        lock.start({"bare": bare})
        with contextlib.redirect_stdout(io.StringIO()):
            train.run(cfg)
        ratios.append(bare.seconds / lock.trainer_seconds)
        print(f"run {r}: trainer {lock.trainer_seconds / a.steps * 1e3:.1f} ms/step, bare "
              f"{bare.seconds / a.steps * 1e3:.1f} ms/step, ratio {ratios[-1]:.3f}", file=sys.stderr)
        lock.start({})
    print(f"hrm-tiny, batch 32, {a.steps} timed steps x {a.repeats} runs, 1 thread, fp32: trainer/bare steps/s "
          f"median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] (target >= 0.97)")


def one_segment_memory(model_name: str, batch: int, checkpointing: bool) -> dict:
    """In a fresh process: bytes saved for the backward of one segment, and the process's peak RSS."""
    code = f"""
import json, resource, torch
from auralm import models
from auralm.training import config
torch.manual_seed(0)
m = models.build("sudoku", config.resolved_model(config.ModelConfig(name={model_name!r})))
m.set_grad_checkpointing({checkpointing})
x = torch.randint(0, 10, ({batch}, 81)); y = torch.randint(0, 9, ({batch}, 81))
carry = m.initial_carry(x, y)
with torch.no_grad():
    carry, *_ = m(carry, x, y)  # a carried state, as in training
seen, saved = set(), [0]
def pack(t):
    key = (t.untyped_storage().data_ptr(), t.dtype)
    if key not in seen:
        seen.add(key); saved[0] += t.untyped_storage().nbytes()
    return t
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    carry, logits, q, target = m(carry, x, y)
    loss, _ = m.loss(carry, logits, q, target)
loss.backward()
print(json.dumps(dict(saved=saved[0], rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    if res.returncode:
        raise SystemExit(res.stderr.strip().splitlines()[-1])
    return json.loads(res.stdout)


def memory(a) -> None:
    print(f"one training segment, batch {a.batch}, fp32: bytes autograd keeps for the backward, and peak RSS")
    print(f"{'model':<12}{'saved, plain':>14}{'checkpointed':>14}{'ratio':>7}{'RSS plain':>11}{'RSS ckpt':>10}")
    for name in a.models.split(","):
        plain, ckpt = (one_segment_memory(name, a.batch, c) for c in (False, True))
        mib = 1 << 20
        print(f"{name:<12}{plain['saved'] / mib:>11.1f}MiB{ckpt['saved'] / mib:>11.1f}MiB"
              f"{ckpt['saved'] / plain['saved']:>7.2f}{plain['rss'] / mib:>8.0f}MiB{ckpt['rss'] / mib:>7.0f}MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    acc = sub.add_parser("accuracy")
    acc.add_argument("--minutes", type=float, default=10)
    acc.add_argument("--models", default="trm-tiny,hrm-tiny")
    acc.add_argument("--difficulty", default="medium,extreme")
    acc.add_argument("overrides", nargs="*", help="trainer overrides for every run (key=value)")
    ov = sub.add_parser("overhead")
    ov.add_argument("--repeats", type=int, default=3)
    ov.add_argument("--steps", type=int, default=40)
    mem = sub.add_parser("memory")
    mem.add_argument("--models", default="hrm-27m,trm-7m")
    mem.add_argument("--batch", type=int, default=16)
    sub.add_parser("paper")
    a = p.parse_args()
    {"accuracy": accuracy, "overhead": overhead, "memory": memory, "paper": lambda a: print(PAPER)}[a.what](a)


if __name__ == "__main__":
    main()
