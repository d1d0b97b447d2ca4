"""Throughput of `auralm.training.train` against a bare loop, and of its GPT against a minimal hand-written GPT.

    python bench/train_throughput.py [--repeats 3] [--sizes tiny,6x384]

For each size, `--repeats` runs of the trainer; during each, step by step in lock-step, three
peers each take one step of their own, in a rotating order:
  trainer      `auralm.training.train.run` on the lm task (Spanish text from ../shared/data): the time from
               one of its optimizer steps to the next (a global optimizer hook) after the warmup
               steps, so everything its loop does per step is in (data, guard, lr, logging), while
               start-up, the final evaluation and the checkpoint are not;
  bare         the same model, weights, batches, AdamW and lr schedule in a plain loop (forward,
               backward, clip, step): no logging, checkpoints or NaN guard;
  minimal      a minimal hand-written GPT of the same shape (SDPA attention, PyTorch's fused tanh
               GELU, tied embeddings) in the same bare loop;
  transformers transformers' GPT2LMHeadModel of the same shape (SDPA, gelu_pytorch_tanh) in the
               same bare loop: the model auralm used before its own, shown for the comparison.
The peers' steps run between the trainer's, so a slow spell of the machine falls on all of them
alike. All in fp32 (the trainer's bf16 on a CPU with native bf16 is off here, as the
peers have none). Time is the thread's CPU time with one thread; a ratio is the quotient of the summed step
times of one run, the table shows the median over the runs with their range.
Targets: trainer/bare >= 0.97, model/minimal >= 1.0.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from auralm import models  # noqa: E402
from auralm.data import datadir
from auralm import tasks
from auralm.planning import cpu_memory
from auralm.training import config, optim, train
from cli.app import main as cli_main  # hrmctl prepare-data, in this process
from bench._lockstep import LockStep  # noqa: E402

QUIJOTE = Path(__file__).resolve().parents[2] / "shared" / "data" / "quijote" / "pg2000.txt"
# Shapes, and the timed steps per run (a 6x384 step takes about 15 times a tiny one).
SHAPES = {"tiny": dict(config.SIZES["tiny"].to_dict(), batch=16, steps=100, warmup=5),
          "6x384": dict(n_layer=6, n_head=6, n_embd=384, block_size=128, batch=8, steps=12, warmup=2)}
ARCH = ("n_layer", "n_head", "n_embd", "block_size")


class MinimalGPT(nn.Module):
    """The reference: GPT-2's architecture in a few lines."""

    def __init__(self, vocab: int, n_layer: int, n_head: int, n_embd: int, block_size: int):
        super().__init__()
        self.n_head = n_head
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(n_embd), qkv=nn.Linear(n_embd, 3 * n_embd), proj=nn.Linear(n_embd, n_embd),
            ln2=nn.LayerNorm(n_embd), fc=nn.Linear(n_embd, 4 * n_embd), out=nn.Linear(4 * n_embd, n_embd)))
            for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, prm in self.named_parameters():  # GPT-2's initialisation, as nanoGPT does it
            if name.endswith("bias"):
                nn.init.zeros_(prm)
            elif prm.dim() == 2:
                nn.init.normal_(prm, std=0.02)

    def forward(self, x, y):
        B, T = x.shape
        h = self.wte(x) + self.wpe(torch.arange(T, device=x.device))
        for b in self.blocks:
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in b.qkv(b.ln1(h)).chunk(3, dim=-1))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + b.proj(a.transpose(1, 2).reshape(B, T, -1))
            h = h + b.out(F.gelu(b.fc(b.ln2(h)), approximate="tanh"))
        logits = self.head(self.ln_f(h))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


class TransformersGPT(nn.Module):
    """transformers' GPT-2 built from a config (no pretrained weights), as auralm's `lm` model once was."""

    def __init__(self, vocab: int, n_layer: int, n_head: int, n_embd: int, block_size: int):
        from transformers import GPT2Config, GPT2LMHeadModel

        super().__init__()
        cfg = GPT2Config(vocab_size=vocab, n_positions=block_size, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                         activation_function="gelu_pytorch_tanh", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)
        cfg._attn_implementation = "sdpa"
        self.hf = GPT2LMHeadModel(cfg)

    def forward(self, x, y):
        logits = self.hf(input_ids=x, use_cache=False).logits
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))


def clock_for(device: torch.device):
    """The clock a step is timed by: the thread's CPU time on the CPU (one thread); on a GPU, whose kernels run
    after the CPU queued them, the wall clock once the device has finished what was queued."""
    if device.type != "cuda":
        return time.thread_time

    def synced() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return synced


class BareLoop:
    """A plain training loop, one step at a time, as the trainer would run it: same seed, batches, AdamW, lr; on
    ``device`` (the model is moved there, each batch too), timed by clock_for(device)."""

    def __init__(self, model: nn.Module, train_set, batch: int, t: config.TrainingConfig,
                 device: torch.device = torch.device("cpu")):
        self.model, self.t, self.device, self.clock = model.to(device), t, device, clock_for(device)
        self.opt = optim.make_optimizer(model, t, device)
        self.batches = datadir.batches(train_set, batch, 0, 1, seed=t.seed)
        self.step_no, self.seconds = 0, 0.0

    def step(self, timed: bool) -> None:
        began = self.clock()
        self.step_no += 1
        for g in self.opt.param_groups:
            g["lr"] = optim.lr_at(self.t, self.step_no)
        x, y = (b.to(self.device) for b in next(self.batches))
        _, loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.t.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if timed:
            self.seconds += self.clock() - began


PEERS = ("bare", "minimal", "transformers")


def one_run(lock: LockStep, data_dir: Path, train_set, vocab: int, shape: dict, out: Path, *,
            device: torch.device = torch.device("cpu"), peers: tuple[str, ...] = PEERS) -> dict[str, float]:
    """One trainer run with its peers in lock-step: seconds per timed step of each (CPU seconds on the CPU; on a
    GPU the trainer takes it, as it does when it sees one, and so do the peers: wall seconds, clock_for)."""
    arch = {k: shape[k] for k in ARCH}
    steps, warmup = shape["steps"], shape["warmup"]
    cfg = config.parse(["task=lm", f"data_dir={data_dir}", f"out_dir={out}", "model=tiny",
                        *[f"model.{k}={v}" for k, v in arch.items()], f"training.batch_size={shape['batch']}",
                        f"training.max_steps={warmup + steps}", "training.log_interval=10",
                        "training.eval_interval=0", "training.eval_batches=1", "training.checkpoint_interval=0",
                        "training.sample_tokens=0", "training.dtype=fp32"])
    builders = {"bare": lambda: models.GPT(config.SIZES["tiny"].replace(**arch, dropout=0.0), vocab),
                "minimal": lambda: MinimalGPT(vocab, **arch),
                "transformers": lambda: TransformersGPT(vocab, **arch)}
    loops = {}
    for name in peers:
        torch.manual_seed(cfg.training.seed)  # the trainer's initial weights, for the bare loop
        loops[name] = BareLoop(builders[name](), train_set, shape["batch"], cfg.training, device)
    lock.start(loops)
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
        train.run(cfg)
    assert lock.steps == warmup + steps, lock.steps
    seconds = {"trainer": lock.trainer_seconds / steps, **{n: p.seconds / steps for n, p in loops.items()}}
    lock.start({})
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sizes", default="tiny,6x384")
    a = p.parse_args()
    torch.set_num_threads(1)
    cpu_memory.keep_freed_memory()  # what the trainer does on CPU, here for every peer alike
    lock = LockStep(warmup=0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    data_dir = tmp / "quijote"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main(["prepare-data", str(QUIJOTE), "--out", str(data_dir), "--vocab-size", "4096",
                         "--max-tokens", "300000"]) == 0
    meta = datadir.load_manifest(data_dir, "lm")
    vocab = meta["tokenizer"]["vocab_size"]
    rows = []
    for size in a.sizes.split(","):
        shape = SHAPES[size]
        train_set = tasks.open_split(data_dir, meta, "train", shape["block_size"])
        lock.warmup = shape["warmup"]
        runs = [one_run(lock, data_dir, train_set, vocab, shape, tmp / f"run-{size}-{r}") for r in range(a.repeats)]
        tokens = shape["batch"] * shape["block_size"]
        rate = {k: statistics.median(tokens / r[k] for r in runs) for k in runs[0]}
        ratios = {"trainer/bare": [r["bare"] / r["trainer"] for r in runs],
                  "model/minimal": [r["minimal"] / r["bare"] for r in runs],
                  "model/transformers": [r["transformers"] / r["bare"] for r in runs]}
        rows.append((size, shape, rate, ratios))
        print(f"{size}: " + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in ratios.items()), file=sys.stderr)
    print(f"\nlm task, vocabulary {vocab}, {a.repeats} runs; tokens per CPU-second, 1 thread")
    print(f"{'size':<7}{'shape':<23}{'trainer':>9}{'bare':>8}{'minimal':>9}{'transf.':>9}"
          f"{'trainer/bare [range]':>23}{'model/minimal [range]':>24}{'model/transf. [range]':>24}")
    for size, shape, rate, ratios in rows:
        desc = f"{shape['n_layer']}x{shape['n_embd']} T{shape['block_size']} B{shape['batch']} S{shape['steps']}"
        cells = "".join(f"{statistics.median(v):.3f} [{min(v):.2f}-{max(v):.2f}]".rjust(w)
                        for v, w in zip(ratios.values(), (23, 24, 24)))
        print(f"{size:<7}{desc:<23}" + "".join(f"{rate[k]:>{w}.0f}" for k, w in
                                               (("trainer", 9), ("bare", 8), ("minimal", 9), ("transformers", 9)))
              + cells)
    print("targets: trainer/bare >= 0.97, model/minimal >= 1.0 (model/transformers: auralm's GPT against the "
          "transformers GPT-2 it replaced)")


if __name__ == "__main__":
    main()
