"""Throughput of `auralm.train` against a bare loop, and of its GPT against a minimal hand-written GPT.

    python bench/train_throughput.py [--repeats 6] [--sizes tiny,6x384]

In one process, for each size, three measurements, interleaved `--repeats` times in a rotating
order; the table shows medians, and for the ratios the median of the per-repeat ratios with
their range:
  trainer  `auralm.train.run` on the lm task (Spanish text from ../shared/data), timed between its
           optimizer steps (a global optimizer hook) after the warmup steps: everything its loop
           does per step is in, start-up and the final evaluation and checkpoint are not;
  bare     the same model, batch, data and AdamW in a plain loop (forward, backward, clip, step),
           no logging, checkpoints or NaN guard;
  minimal  a minimal hand-written GPT of the same shape (SDPA attention, PyTorch's fused tanh
           GELU, tied embeddings) in the same bare loop.
Time is this process's CPU time with one thread: on a machine shared with other jobs the wall
clock of a step swings by tens of percent, its CPU time by a few.
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
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from auralm import config, data, models, train  # noqa: E402

QUIJOTE = Path(__file__).resolve().parents[2] / "shared" / "data" / "quijote" / "pg2000.txt"
# Shapes, and the timed steps per measurement (a 6x384 step takes about 100 times a tiny one).
SHAPES = {"tiny": dict(config.SIZES["tiny"], batch=16, steps=100, warmup=5),
          "6x384": dict(n_layer=6, n_head=6, n_embd=384, block_size=128, batch=8, steps=8, warmup=2)}


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


def bare_loop(model, train_set, batch: int, steps: int, warmup: int) -> float:
    """CPU seconds per step of a plain training loop, over ``steps`` steps after ``warmup`` untimed ones."""
    t = config.TrainingConfig()
    opt = train.make_optimizer(model, t, torch.device("cpu"))
    batches = data.batches(train_set, batch, 0, 1, seed=0)
    for i in range(warmup + steps):
        if i == warmup:
            start = time.process_time()
        x, y = next(batches)
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return (time.process_time() - start) / steps


STAMPS: list[float] = []  # CPU time at every optimizer step in this process
register_optimizer_step_post_hook(lambda *_: STAMPS.append(time.process_time()))


def trainer(data_dir: Path, shape: dict, steps: int, warmup: int, out: Path) -> float:
    """CPU seconds per step of ``auralm.train.run``, between its optimizer steps after ``warmup``."""
    arch = [f"model.{k}={shape[k]}" for k in ("n_layer", "n_head", "n_embd", "block_size")]
    cfg = config.parse(["task=lm", f"data_dir={data_dir}", f"out_dir={out}", "model=tiny", *arch,
                        f"training.batch_size={shape['batch']}", f"training.max_steps={warmup + steps}",
                        "training.log_interval=10", "training.eval_interval=0", "training.eval_batches=1",
                        "training.checkpoint_interval=0", "training.sample_tokens=0"])
    STAMPS.clear()
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
        train.run(cfg)
    return (STAMPS[-1] - STAMPS[warmup - 1]) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--sizes", default="tiny,6x384")
    a = p.parse_args()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    data_dir = tmp / "quijote"
    assert data.main([str(QUIJOTE), "--out", str(data_dir), "--vocab-size", "4096", "--max-tokens", "300000"]) == 0
    meta = data.load_manifest(data_dir, "lm")
    vocab = meta["tokenizer"]["vocab_size"]
    rows = []
    for size in a.sizes.split(","):
        shape = SHAPES[size]
        arch = {k: shape[k] for k in ("n_layer", "n_head", "n_embd", "block_size")}
        train_set = data.open_split(data_dir, meta, "train", shape["block_size"])
        steps, warmup = shape["steps"], shape["warmup"]
        runs = {
            "trainer": lambda r: trainer(data_dir, shape, steps, warmup, tmp / f"run-{size}-{r}"),
            "bare": lambda r: bare_loop(models.GPT(dict(arch, dropout=0.0), vocab), train_set, shape["batch"],
                                        steps, warmup),
            "minimal": lambda r: bare_loop(MinimalGPT(vocab, **arch), train_set, shape["batch"], steps, warmup),
        }
        runs["trainer"]("warm")  # untimed: the first run in a process imports transformers' GPT-2 code
        sec = {name: [] for name in runs}
        names = list(runs)
        for r in range(a.repeats):
            for name in names[r % 3:] + names[: r % 3]:  # a different order each repeat
                torch.manual_seed(0)
                sec[name].append(runs[name](r))
        tokens = shape["batch"] * shape["block_size"]
        rate = {k: [tokens / s for s in v] for k, v in sec.items()}
        ratios = {"trainer/bare": [t / b for t, b in zip(rate["trainer"], rate["bare"])],
                  "model/minimal": [b / m for b, m in zip(rate["bare"], rate["minimal"])]}
        rows.append((size, shape, {k: statistics.median(v) for k, v in rate.items()}, ratios))
    print(f"\nlm task, vocabulary {vocab}, {a.repeats} repeats; tokens per CPU-second, 1 thread")
    print(f"{'size':<7}{'shape':<23}{'trainer tok/s':>14}{'bare tok/s':>11}{'minimal tok/s':>14}"
          f"{'trainer/bare [range]':>24}{'model/minimal [range]':>25}")
    for size, shape, med, ratios in rows:
        desc = f"{shape['n_layer']}x{shape['n_embd']} T{shape['block_size']} B{shape['batch']} S{shape['steps']}"
        cells = [f"{statistics.median(v):.3f} [{min(v):.2f}-{max(v):.2f}]" for v in ratios.values()]
        print(f"{size:<7}{desc:<23}{med['trainer']:>14.0f}{med['bare']:>11.0f}{med['minimal']:>14.0f}"
              f"{cells[0]:>24}{cells[1]:>25}")
    print("targets: trainer/bare >= 0.97, model/minimal >= 1.0")


if __name__ == "__main__":
    main()
