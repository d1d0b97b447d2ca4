"""mHC against the plain transformer: training speed, and validation loss at equal tokens.

    python bench/mhc.py speed [--model rlm-tiny] [--batch 8] [--steps 6] [--dtype auto] [--width 256,512]
    [--same-process]
    python bench/mhc.py loss  [--model rlm-tiny] [--batch 16] [--steps 400] [--eval 25]

speed: the two models built from the same keys (``model.mhc_enabled`` true with mhc_flows=4, and false),
       each in a process of its own as in training (one thread, the same core), timed alternately, a
       training step (forward, backward, AdamW) at a time, on the Spanish text of ../shared/data; tokens/s
       of each and their ratio (medians), for each width. --same-process: both in one process, as this
       bench did before session 16 (their steps then share one heap and allocator).
loss:  `python -m auralm.training.train` twice (the two run side by side, one core each) on the same data, seed,
       batch and steps, so both see the same tokens; validation loss every --eval steps, and the largest
       mhc/amax_pre and amax_post of the mHC run. Writes docs/figures/mhc-loss.png (matplotlib) when it can.
Figures go to stdout as markdown (docs/rlm.md has the last ones).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
QUIJOTE = ROOT.parent / "shared" / "data" / "quijote" / "pg2000.txt"


def prepare(tmp: Path) -> Path:
    from cli.app import main as cli_main  # hrmctl prepare-data, in this process

    out = tmp / "quijote"
    assert cli_main(["prepare-data", str(QUIJOTE), "--out", str(out), "--vocab-size", "4096"]) == 0
    return out


def _trainer(a, data_dir: Path, width: int, mhc: bool):
    """One model's training step, as a function that returns the tokens it trained on; and the dtype's name."""
    import torch

    from auralm import models
    from auralm.data import datadir
    from auralm import tasks
    from auralm.training import command_line, config, optim, train

    meta = datadir.load_manifest(data_dir, "lm")
    cfg = command_line.parse(["task=lm", f"model={a.model}", f"model.hidden_dim={width}",
                        f"model.num_heads={width // 64}", f"model.ffn_dim={-(-8 * width // 3 // 16) * 16}",
                        f"model.mhc_enabled={str(mhc).lower()}", f"training.dtype={a.dtype}",
                        f"training.batch_size={a.batch}"])
    arch = config.resolved_model(cfg.model)
    ds = tasks.open_split(data_dir, meta, "train", arch.block_size)
    torch.manual_seed(0)
    model = models.build("lm", arch, meta["tokenizer"]["vocab_size"])
    opt = optim.make_optimizer(model, cfg.training, torch.device("cpu"))
    batches = datadir.batches(ds, a.batch, 0, 1, 0)

    def step() -> int:
        x, y = next(batches)
        with train.autocast(cfg.training, torch.device("cpu")):
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return x.numel()

    dtype = "bf16" if isinstance(train.autocast(cfg.training, torch.device("cpu")), torch.autocast) else "fp32"
    return step, dtype


def _setup_process() -> None:
    import torch

    from auralm.planning import cpu_memory

    torch.set_num_threads(1)
    cpu_memory.keep_freed_memory()  # what the trainer does on CPU


def step_worker(a) -> None:
    """One model in a process of its own, as in training: a training step for every line on stdin, its seconds
    on stdout."""
    _setup_process()
    step, dtype = _trainer(a, Path(a.data_dir), a.width[0], a.mhc == "true")
    stepper = _timed(step)
    print(dtype, flush=True)
    for _ in sys.stdin:
        tokens, seconds = stepper()
        print(f"{tokens} {seconds}", flush=True)


def speed(a, tmp: Path) -> None:
    data_dir = prepare(tmp)
    where = "one process" if a.same_process else "a process each"
    out = ["| width | dtype | plain tokens/s | mHC n=4 tokens/s | ratio | models in |", "|---|---|---|---|---|---|"]
    if a.same_process:
        _setup_process()
    for width in a.width:
        if a.same_process:  # both models in this process: they share its allocator and its heap
            runs = {mhc: _trainer(a, data_dir, width, mhc) for mhc in (False, True)}
            steppers = {mhc: _timed(step) for mhc, (step, _) in runs.items()}
            dtype, procs = runs[True][1], []
        else:
            steppers, dtype, procs = _workers(a, data_dir, width)
        rates = {mhc: [] for mhc in steppers}
        for rep in range(a.steps + 1):  # alternately, so both see the same state of the machine
            for mhc, stepper in steppers.items():
                tokens, seconds = stepper()
                if rep:  # the first step of each warms up
                    rates[mhc].append(tokens / seconds)
        for proc in procs:  # end of stdin: the worker leaves
            proc.stdin.close()
            proc.wait()
        plain, wide = (sorted(rates[m])[len(rates[m]) // 2] for m in (False, True))  # medians
        out.append(f"| {width} | {dtype} | {plain:.0f} | {wide:.0f} | {wide / plain:.2f} | {where} |")
        print(out[-1], file=sys.stderr, flush=True)
    print("\n".join(out))


def _timed(step):
    def stepper() -> tuple[int, float]:
        began = time.perf_counter()
        tokens = step()
        return tokens, time.perf_counter() - began
    return stepper


def _workers(a, data_dir: Path, width: int):
    """A step_worker for each model, both on the same core (this one's first), stepped in turn."""
    core = sorted(os.sched_getaffinity(0))[0]
    steppers, dtype, procs = {}, "?", []
    for mhc in (False, True):
        cmd = [sys.executable, __file__, "step-worker", "--data-dir", str(data_dir), "--width", str(width),
               "--mhc", str(mhc).lower(), "--model", a.model, "--batch", str(a.batch), "--dtype", a.dtype]
        proc = subprocess.Popen(["taskset", "-c", str(core), *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        procs.append(proc)
        dtype = proc.stdout.readline().strip() or sys.exit(f"the worker for mhc={mhc} did not start")

        def stepper(proc=proc, mhc=mhc) -> tuple[int, float]:
            proc.stdin.write("step\n")
            proc.stdin.flush()
            reply = proc.stdout.readline().split() or sys.exit(f"the worker for mhc={mhc} stopped")
            return int(reply[0]), float(reply[1])
        steppers[mhc] = stepper
    return steppers, dtype, procs


def loss(a, tmp: Path) -> None:
    data_dir = prepare(tmp)
    common = ["task=lm", f"data_dir={data_dir}", f"model={a.model}", f"training.batch_size={a.batch}",
              f"training.max_steps={a.steps}", f"training.eval_interval={a.eval}", "training.eval_batches=16",
              "training.checkpoint_interval=0", f"training.log_interval={a.eval}", "training.sample_tokens=0",
              f"training.lr={a.lr}", f"training.warmup_steps={a.steps // 20}"]
    procs, runs = {}, {}
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for i, mhc in enumerate(("true", "false")):
        runs[mhc] = tmp / f"run-mhc-{mhc}"
        cmd = [sys.executable, "-m", "auralm.training.train", *common, f"model.mhc_enabled={mhc}",
               f"out_dir={runs[mhc]}"]
        procs[mhc] = subprocess.Popen(["taskset", "-c", str(i % (os.cpu_count() or 1)), *cmd], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for mhc, p in procs.items():
        if p.wait() != 0:
            sys.exit(f"the run with mhc_enabled={mhc} failed: {p.stderr.read()[-2000:]}")
    rows = {m: [json.loads(line) for line in (runs[m] / "metrics.jsonl").read_text().splitlines()] for m in runs}
    curves = {m: [(r["step"], r["val_loss"]) for r in rows[m] if "val_loss" in r] for m in rows}
    out = ["| step | tokens | val loss, mHC n=4 | val loss, plain | amax pre / post (mHC) |", "|---|---|---|---|---|"]
    amax = {r["step"]: (r.get("mhc/amax_pre"), r.get("mhc/amax_post")) for r in rows["true"]}
    from auralm.training import config

    block = config.resolved_model(config.parse(["task=lm", f"model={a.model}"]).model)["block_size"]
    tokens = a.batch * block
    for (step, wide), (_, plain) in zip(curves["true"], curves["false"]):
        pre, post = amax.get(step, (None, None))
        out.append(f"| {step} | {step * tokens:,} | {wide:.4f} | {plain:.4f} | "
                   f"{pre:.4f} / {post:.4f} |" if pre is not None else f"| {step} | {step * tokens:,} | {wide:.4f} | "
                   f"{plain:.4f} | - |")
    worst = max(max(p or 0, q or 0) for p, q in amax.values())
    out.append(f"\nlargest amax over the mHC run: {worst:.4f}; train seconds: mHC "
               f"{rows['true'][-1]['train_s']:.0f}, plain {rows['false'][-1]['train_s']:.0f}")
    print("\n".join(out))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m, label in (("true", "mHC, n=4"), ("false", "plain (mhc_enabled=false)")):
        ax.plot([s * tokens / 1e6 for s, _ in curves[m]], [v for _, v in curves[m]], marker="o", ms=3, label=label)
    ax.set_xlabel("training tokens (millions)")
    ax.set_ylabel("validation loss")
    ax.set_title(f"model={a.model} on Don Quijote, batch {a.batch} x {block} tokens, same seed")
    ax.grid(alpha=0.3)
    ax.legend()
    target = ROOT / "docs" / "figures" / "mhc-loss.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    print(f"wrote {target.relative_to(ROOT)}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("speed", "loss", "step-worker"))
    p.add_argument("--model", default="rlm-tiny")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--width", default="256", help="speed: hidden sizes to time, comma-separated")
    p.add_argument("--eval", type=int, default=25)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--same-process", action="store_true",
                   help="speed: both models in this one process (the earlier way: they share one heap)")
    p.add_argument("--data-dir", help=argparse.SUPPRESS)  # step-worker's
    p.add_argument("--mhc", help=argparse.SUPPRESS)  # step-worker's
    a = p.parse_args()
    a.width = [int(w) for w in a.width.split(",")]
    a.batch = a.batch or (8 if a.what == "speed" else 16)
    a.steps = a.steps or (6 if a.what == "speed" else 400)
    if a.what == "step-worker":
        return step_worker(a)
    with tempfile.TemporaryDirectory(prefix="bench-mhc-") as tmp:
        {"speed": speed, "loss": loss}[a.what](a, Path(tmp))


if __name__ == "__main__":
    main()
