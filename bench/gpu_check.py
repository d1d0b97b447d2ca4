"""Every CUDA path of the trainer on one GPU, in at most 5 minutes: a table, and exit 1 on a wrong result.

    python bench/gpu_check.py [--only bf16,fp16,...] [--budget 300] [--work DIR]

Each check runs as a process of its own (`--one NAME`) with its own time cap, one after another; a check is given
at most what is left of the budget (300 s), so the whole ends within it, and one that would start with too little
left is reported as not run (a failure: it was not verified). The checks, in order:

  data        the text the runs train on: this repository's README and docs, prepared by `hrmctl prepare-data`
  nvidia-smi  `nvidia-smi` read live by the project's own parser (node/setup.py: nvidia_smi, torch_build's
              parse_nvidia_smi, as `hrmctl setup` reads it; tests/recorded/ holds a recorded one) and by the node
              probe (node/probe.py: the driver and GPU count), against what torch sees
  bf16        `python -m auralm.training.train` on a GPT with training.dtype=bf16 (autocast): ends 0, its loss finite
              and lower at the end than at the start; its tokens/s feed mfu
  fp16        the same with training.dtype=fp16: autocast in float16 with the GradScaler, whose scale the
              checkpoint holds (finite, positive)
  nccl        the NCCL world of one: torchrun with one rank running auralm.planning.ddp_check --backend nccl (the
              self-test of `hrmctl test-ddp`): the world agrees on NCCL on cuda:0 and its collectives are right
  fsdp        FSDP on one device: auralm.parallel.fsdp.shard (FSDP2, bf16 compute, and with CPU offload) in an NCCL
              process group of one against an unsharded copy; then the trainer with training.parallel=fsdp, its
              sharded (DCP) checkpoint written and resumed
  memory      the launcher's memory estimate (`python -m auralm.planning.sizing --json`, what cli/launch/plan/memory.py
              runs) against the peak the trainer measured (torch.cuda.max_memory_allocated: cuda_peak_gb in its
              metrics), fp32: within the factor of 1.5 the estimate claims
  doctor      `hrmctl doctor --nodes localhost`: exit 0, the gpu row names this GPU, the backend is NCCL
  mhc         mHC (auralm/models/mhc.py, the rlm models): its CUDA path (PyTorch's operations) against its CPU one
              (the fused C loops) on the same weights and tokens, loss and gradients; then the trainer on rlm-tiny
              with its amax figures
  throughput  the trainer's tokens/s against bench/train_throughput.py's bare loop of the same GPT, in lock-step in
              one process (its one_run and BareLoop): at least 0.8 of it (a sanity bound, not the CPU's 0.97 target:
              no GPU figure has been measured yet)
  mfu         model FLOPs utilisation of the bf16 run's GPT: 6 x parameters x tokens/s over the GPU's bf16 peak
              (PEAK_TFLOPS by device name, else a measured bf16 matmul); wrong outside (0, 1]

On a machine without a CUDA GPU it says it found none and exits 0; where `nvidia-smi` shows a GPU that this torch
cannot use, that is a failure (exit 1) naming the fix. GPU_CHECK_SMOKE=1 runs the checks on the CPU with a tiny
model, to test this script where there is no GPU (gloo for NCCL, the recorded nvidia-smi, figures meaningless).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUDGET_S = 300.0
MIN_START_S = 5.0  # a check is not started with less than this left of the budget
TAG = "GPU_CHECK "
OK, FAIL = "ok", "fail"
SMOKE = os.environ.get("GPU_CHECK_SMOKE") == "1"
# the GPT of the runs: big enough that a GPU step is not all launch overhead; SMOKE: a CPU's
RUN = (dict(model="tiny", batch=4, steps=6, log=2) if SMOKE else dict(model="small", batch=32, steps=40, log=5))
ESTIMATE_FACTOR = 1.5  # auralm/planning/sizing.py: within a factor of about 1.5 of what was measured
THROUGHPUT_MIN = 0.8
# dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by a fragment of torch.cuda.get_device_name(); the first match
PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0), ("B200", 2250.0),
               ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("A10G", 70.0),
               ("A10", 125.0), ("RTX 6000 Ada", 364.0), ("RTX 5090", 209.5), ("RTX 4090", 165.2),
               ("RTX 4080", 97.5), ("RTX 3090", 71.0), ("RTX 3080", 59.5), ("RTX A6000", 155.0))


@dataclass
class Outcome:
    name: str
    status: str            # ok / fail
    detail: str
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)


# ---------------------------------------------------------------- the verdict and the table (pure)

def exit_code(outcomes: list[Outcome]) -> int:
    """0 when every check ran and passed, else 1."""
    return 0 if outcomes and all(o.status == OK for o in outcomes) else 1


def report(outcomes: list[Outcome], console, gpu: str) -> int:
    """The table (rich) and the summary line; returns exit_code(outcomes)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"gpu_check — {gpu}", title_justify="left")
    for col in ("check", "status", "s", "detail"):
        table.add_column(col, overflow="fold", justify="right" if col == "s" else "left")
    for o in outcomes:
        style = "green" if o.status == OK else "bold red"
        table.add_row(o.name, f"[{style}]{o.status}[/]", f"{o.seconds:.1f}", escape(o.detail))
    console.print(table)
    failed = [o.name for o in outcomes if o.status != OK]
    total = sum(o.seconds for o in outcomes)
    console.print(f"summary: {len(outcomes) - len(failed)} of {len(outcomes)} checks passed in {total:.0f}s"
                  + (f"; failed: {', '.join(failed)}" if failed else ""), highlight=False)
    return exit_code(outcomes)


# ---------------------------------------------------------------- running the checks, each with its cap

def run_one(name: str, cap_s: float, work: Path) -> Outcome:
    """`--one NAME` as a process of its own (its own session: a cap that runs out stops its children too)."""
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--one", name, "--work", str(work)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=cap_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Outcome(name, FAIL, f"did not finish within its cap of {cap_s:.0f}s", time.monotonic() - t0)
    return parse_outcome(name, proc.returncode, out, err, time.monotonic() - t0)


def parse_outcome(name: str, code: int, out: str, err: str, seconds: float) -> Outcome:
    line = next((l for l in reversed(out.splitlines()) if l.startswith(TAG)), None)
    if line is None:
        last = (err.strip().splitlines() or [f"exit code {code}"])[-1]
        return Outcome(name, FAIL, f"no result (exit code {code}): {last[:300]}", seconds)
    doc = json.loads(line[len(TAG):])
    return Outcome(name, doc["status"], doc["detail"], seconds, doc.get("figures") or {})


def run_all(names: list[str], budget_s: float, work: Path) -> list[Outcome]:
    deadline = time.monotonic() + budget_s
    outcomes = []
    for name in names:
        left = deadline - time.monotonic()
        if left < MIN_START_S:
            outcomes.append(Outcome(name, FAIL, f"not run: {max(left, 0):.0f}s of the {budget_s:.0f}s budget left"))
            continue
        outcomes.append(run_one(name, min(CAPS[name], left), work))
        print(f"{name}: {outcomes[-1].status} ({outcomes[-1].seconds:.1f}s)", file=sys.stderr, flush=True)
    return outcomes


# ---------------------------------------------------------------- helpers of the checks (in the check's process)

def device():
    import torch

    return torch.device("cpu") if SMOKE else torch.device("cuda", 0)


def data_dir(work: Path) -> Path:
    return work / "data"


def vocab(work: Path) -> int:
    return json.loads((data_dir(work) / "meta.json").read_text())["tokenizer"]["vocab_size"]


def train(work: Path, run: str, *overrides: str, torchrun: bool = False, model: str | None = None):
    """The trainer on the data, one rank; (completed process, metrics records, run directory)."""
    out = work / "runs" / run
    cmd = [sys.executable, "-m", "auralm.training.train"]
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m",
               "auralm.training.train"]
    cmd += ["task=lm", f"data_dir={data_dir(work)}", f"out_dir={out}", f"model={model or RUN['model']}",
            f"training.batch_size={RUN['batch']}", f"training.max_steps={RUN['steps']}",
            f"training.log_interval={RUN['log']}", "training.eval_interval=0", "training.eval_batches=1",
            "training.checkpoint_interval=0", "training.sample_tokens=0", "training.warmup_steps=5",
            "logging.curves=false", *overrides]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    metrics = out / "metrics.jsonl"
    records = [json.loads(l) for l in metrics.read_text().splitlines()] if metrics.exists() else []
    return res, records, out


def learned(res, records) -> str | None:
    """None when the run ended 0 with finite losses, the last below the first; else what went wrong."""
    if res.returncode != 0:
        return f"the trainer exited {res.returncode}: " + ((res.stderr or res.stdout).strip().splitlines() or [""])[-1]
    losses = [r.get("loss") for r in records if "loss" in r]
    if len(losses) < 2:
        return f"{len(losses)} loss records in metrics.jsonl"
    if not all(isinstance(x, float) and math.isfinite(x) for x in losses):
        return f"a non-finite loss: {losses}"
    if losses[-1] >= losses[0]:
        return f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
    return None


def rate(records) -> float:
    """Tokens/s of a run: the median of its log records after the first (warm-up)."""
    rates = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")]
    return statistics.median(rates[1:] or rates)


def loss_text(records) -> str:
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    return f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"


def result(status: bool, detail: str, **figures) -> tuple[str, str, dict]:
    return (OK if status else FAIL), detail, figures


# ---------------------------------------------------------------- the checks

def check_data(work: Path):
    from cli.app import main as cli_main  # hrmctl prepare-data, in this process

    corpus = work / "corpus.txt"
    corpus.write_text("\n\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]))
    code = cli_main(["prepare-data", str(corpus), "--out", str(data_dir(work)), "--vocab-size", "4096"])
    return result(code == 0, f"{corpus.stat().st_size / 1e3:.0f} kB of text, vocabulary {vocab(work)}")


def check_nvidia_smi(work: Path):
    import torch

    from cli.setup import torch_build
    from node import probe as node_probe, setup as node_setup

    text = (ROOT / "tests/recorded/nvidia-smi-rtx4090.txt").read_text() if SMOKE else node_setup.nvidia_smi()
    smi = torch_build.parse_nvidia_smi(text)
    if smi is None:
        return result(False, "nvidia-smi gave nothing the parser reads: " + (text or "no output")[:200])
    if SMOKE:
        return result(True, f"recorded: {smi['gpus'][0]}, driver {smi['driver']} (CUDA {smi['cuda'][0]}.{smi['cuda'][1]})")
    name, count = torch.cuda.get_device_name(0), torch.cuda.device_count()
    shown = smi["gpus"][0].rstrip(".")
    wrong = []
    if not (name.startswith(shown) or shown.startswith(name)):
        wrong.append(f"nvidia-smi's GPU 0 is {smi['gpus'][0]!r}, torch's {name!r}")
    if "CUDA_VISIBLE_DEVICES" not in os.environ and len(smi["gpus"]) != count:
        wrong.append(f"nvidia-smi shows {len(smi['gpus'])} GPUs, torch {count}")
    if node_probe.gpu_driver() != smi["driver"] or node_probe.nvidia_gpu_count() != len(smi["gpus"]):
        wrong.append(f"the probe reads driver {node_probe.gpu_driver()}, {node_probe.nvidia_gpu_count()} GPUs")
    cuda = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    if smi["cuda"] < cuda:
        wrong.append(f"the driver runs CUDA {smi['cuda']}, older than this torch's {torch.version.cuda}")
    build = torch_build.choose(torch.__version__, text)
    return result(not wrong, "; ".join(wrong) or f"{smi['gpus'][0]} x{len(smi['gpus'])}, driver {smi['driver']} "
                  f"(CUDA {smi['cuda'][0]}.{smi['cuda'][1]}); hrmctl setup would install {build.tag}",
                  gpus=smi["gpus"], driver=smi["driver"])


def check_bf16(work: Path):
    from auralm.planning import sizing
    from auralm.training import config

    res, records, _ = train(work, "bf16", "training.dtype=bf16")
    why = learned(res, records)
    if why:
        return result(False, why)
    arch = config.resolved_model(config.parse([f"model={RUN['model']}", "task=lm"]).model)
    n = sizing.count_parameters("lm", arch, vocab(work))
    tps = rate(records)
    return result(True, f"{loss_text(records)}, {tps:,.0f} tokens/s, {n / 1e6:.1f}M parameters", tokens_per_s=tps,
                  parameters=n)


def check_fp16(work: Path):
    from auralm.training import checkpoint

    res, records, out = train(work, "fp16", "training.dtype=fp16")
    why = learned(res, records)
    if why:
        return result(False, why)
    ckpts = sorted(out.glob("checkpoint-*"), key=checkpoint.step_of)
    scaler = checkpoint.read_extra(ckpts[-1], "grad_scaler") if ckpts else None
    scale = (scaler or {}).get("scale")
    ok = scale is not None and math.isfinite(float(scale)) and float(scale) > 0
    return result(ok, f"{loss_text(records)}; GradScaler scale {scale}" if scaler else
                  f"{loss_text(records)}; no GradScaler state in the checkpoint {ckpts[-1] if ckpts else '(none)'}")


def check_nccl(work: Path):
    backend = "gloo" if SMOKE else "nccl"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m",
                          "auralm.planning.ddp_check", "--backend", backend, "--no-table", "--seconds", "0.05",
                          "--max-size", "16MiB", "--probe-seconds", "0.5"], cwd=ROOT, capture_output=True, text=True)
    line = next((l for l in res.stdout.splitlines() if l.startswith("HRMCTL_RESULT ")), None)
    if line is None:
        return result(False, f"ddp_check exited {res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1]}")
    doc = json.loads(line.split(" ", 1)[1])
    rank0 = doc["ranks"][0]
    ok = (doc["ok"] and doc["backend"] == backend and doc["world_size"] == 1 and res.returncode == 0
          and rank0["device"].startswith("cpu" if SMOKE else "cuda"))
    big = (doc.get("bandwidth") or [{}])[-1]
    lat = (doc.get("latency") or {}).get("p50_us")
    wrong = [k for k, v in doc["checks"].items() if v]
    return result(ok, f"world {doc['world_size']}, backend {doc['backend']} ({doc['reason']}), device "
                  f"{rank0['device']}; checks " + (f"WRONG: {', '.join(wrong)}" if wrong else "ok")
                  + (f"; all_reduce {big.get('algbw_GBps', 0):.1f} GB/s at {big.get('bytes', 0) >> 20} MiB, "
                     f"latency {lat:.0f} us" if lat is not None else ""))


def fsdp_worker(out: Path) -> None:
    """Under torchrun, one rank: auralm.parallel.fsdp.shard in a process group of one, against a whole copy."""
    import copy

    import torch
    import torch.distributed as dist

    from auralm import models
    from auralm.parallel import fsdp
    from auralm.training import config, optim

    dev = device()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # before the group: NCCL binds to the current device
    dist.init_process_group("gloo" if SMOKE else "nccl")
    cfg = config.parse(["model=mini", "task=lm"])
    torch.manual_seed(0)
    whole = models.build("lm", config.resolved_model(cfg.model), 512).to(dev)
    runs = {}
    for name, offload in (("sharded", False), ("offloaded", True), ("whole", None)):
        model = copy.deepcopy(whole)
        if offload is not None:
            fsdp.shard(model, bf16=not SMOKE, cpu_offload=offload, device=dev)
        opt = optim.make_optimizer(model, cfg.training, dev)
        g = torch.Generator().manual_seed(1)
        losses = []
        for _ in range(6):
            x = torch.randint(0, 512, (8, 64), generator=g).to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=offload is None and not SMOKE):
                _, loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        runs[name] = {"losses": losses, "sharded": fsdp.is_sharded(model)}
    out.write_text(json.dumps(runs))
    dist.destroy_process_group()


def check_fsdp(work: Path):
    out = work / "fsdp-worker.json"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                          str(Path(__file__).resolve()), "--fsdp-worker", str(out)], cwd=ROOT, capture_output=True,
                         text=True)
    if res.returncode != 0 or not out.exists():
        return result(False, f"the FSDP worker exited {res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1]}")
    runs = json.loads(out.read_text())
    wrong = [f"{n}: {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}" for n, r in runs.items()
             if not all(math.isfinite(x) for x in r["losses"]) or r["losses"][-1] >= r["losses"][0]]
    first = {n: r["losses"][0] for n, r in runs.items()}
    if max(abs(first[n] - first["whole"]) / first["whole"] for n in first) > 0.02:  # bf16 casts: within 2 %
        wrong.append(f"first losses differ: {first}")
    if not (runs["sharded"]["sharded"] and runs["offloaded"]["sharded"]):
        wrong.append("fully_shard left the model unsharded")
    res, records, run = train(work, "fsdp", "training.parallel=fsdp", f"training.checkpoint_interval={RUN['log']}",
                              torchrun=True)
    why = learned(res, records)
    dcp = sorted(run.glob("checkpoint-*/dcp/.metadata"))
    if why or not dcp:
        return result(False, "; ".join(wrong + [why or "no sharded (DCP) checkpoint written"]))
    more = RUN["steps"] + 2 * RUN["log"]
    res2, _, _ = train(work, "fsdp", "training.parallel=fsdp", "resume=latest", f"training.max_steps={more}",
                       torchrun=True)
    if res2.returncode != 0 or "resuming from" not in res2.stdout:
        wrong.append(f"resume=latest from the DCP checkpoint: exit {res2.returncode}, "
                     f"{(res2.stderr.strip().splitlines() or [''])[-1]}")
    how = "fp32" if SMOKE else "bf16 compute"
    return result(not wrong, "; ".join(wrong) or f"fully_shard ({how}, and with CPU offload) against a whole copy: "
                  f"first loss {first['sharded']:.4f} / {first['whole']:.4f}; the trainer with parallel=fsdp "
                  f"{loss_text(records)}, DCP checkpoint written and resumed to step {more}")


def check_memory(work: Path):
    args = [f"model={RUN['model']}", "task=lm", f"training.batch_size={RUN['batch'] // 2}", "training.dtype=fp32"]
    est = subprocess.run([sys.executable, "-m", "auralm.planning.sizing", "--json", "--vocab", str(vocab(work)), *args],
                         cwd=ROOT, capture_output=True, text=True)
    if est.returncode != 0:
        return result(False, f"the estimate exited {est.returncode}: {est.stderr.strip()[-200:]}")
    estimate = json.loads(est.stdout)["total_bytes"]
    res, records, _ = train(work, "memory", *args[2:], f"training.max_steps={2 * RUN['log']}")
    peaks = [r.get("cuda_peak_gb") for r in records if r.get("cuda_peak_gb")]
    if res.returncode != 0 or not peaks:
        return result(False, learned(res, records) or "no cuda_peak_gb in the metrics (not on a GPU?)")
    peak = max(peaks) * 1e9
    ratio = peak / estimate
    ok = 1 / ESTIMATE_FACTOR <= ratio <= ESTIMATE_FACTOR
    return result(ok, f"estimate {estimate / 2**30:.2f} GiB, measured peak {peak / 2**30:.2f} GiB (max_memory_allocated):"
                  f" measured/estimate {ratio:.2f}, within {ESTIMATE_FACTOR:g}x" + ("" if ok else ": NOT"),
                  estimate_bytes=estimate, peak_bytes=peak, ratio=ratio)


def check_doctor(work: Path):
    import torch

    res = subprocess.run([sys.executable, "-m", "cli", "doctor", "--nodes", "localhost", "--json", "--timeout", "60"],
                         cwd=ROOT, capture_output=True, text=True)  # localhost's workdir: here, this checkout
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        return result(False, f"doctor exited {res.returncode}: {(res.stderr.strip().splitlines() or [''])[-1]}")
    checks = doc["nodes"]["localhost"]["checks"]
    bad = [f"{k}: {v['status']} {v['detail']}" for k, v in checks.items() if v["status"] == FAIL]
    gpu, backend = checks["gpu"], doc["cluster"]["backend"]
    name = "none (CPU)" if SMOKE else torch.cuda.get_device_name(0)
    want = "gloo" if SMOKE else "nccl"
    if gpu["status"] != OK or name not in gpu["detail"]:
        bad.append(f"gpu row: {gpu['status']} {gpu['detail']} (torch: {name})")
    if not backend["detail"].startswith(want):
        bad.append(f"backend: {backend['detail']}")
    return result(res.returncode == 0 and not bad, "; ".join(bad) or f"exit {res.returncode}; gpu: {gpu['detail']}; "
                  f"nccl/gloo: {checks['nccl/gloo']['detail']}; backend {backend['detail']}")


def mhc_devices() -> str | None:
    """rlm-tiny's loss and gradients on this device (mHC in PyTorch's operations) against the CPU (its fused C loops),
    the same weights and tokens, fp32; None when they agree."""
    import copy

    import torch

    from auralm import models
    from auralm.training import config

    cfg = config.parse(["model=rlm-tiny", "task=lm", "model.n_layer=2"])
    torch.manual_seed(0)
    cpu = models.build("lm", config.resolved_model(cfg.model), 512)
    dev = copy.deepcopy(cpu).to(device())
    x = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(2))
    losses, grads = [], []
    for model, xs in ((cpu, x), (dev, x.to(device()))):
        _, loss = model(xs, xs)
        loss.backward()
        losses.append(float(loss))
        grads.append({n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None})
    worst = max(float((grads[0][n] - grads[1][n]).abs().max() / (grads[0][n].abs().max() + 1e-12)) for n in grads[0])
    if abs(losses[0] - losses[1]) > 1e-4 * abs(losses[0]) or worst > 1e-3:
        return f"CPU and {device()} differ: loss {losses[0]:.6f} / {losses[1]:.6f}, worst gradient {worst:.2e}"
    return None


def check_mhc(work: Path):
    from auralm.models.rlm.model import AMAX_WARN

    wrong = mhc_devices()
    res, records, _ = train(work, "mhc", model="rlm-tiny")
    why = learned(res, records)
    amax = [max(r["mhc/amax_pre"], r["mhc/amax_post"]) for r in records if "mhc/amax_pre" in r]
    if why or not amax or not all(math.isfinite(a) and a < AMAX_WARN for a in amax):
        return result(False, "; ".join(x for x in (wrong, why, f"amax {amax}") if x))
    return result(not wrong, wrong or f"CPU (fused) and {device()} agree; the trainer on rlm-tiny {loss_text(records)}, "
                  f"amax at most {max(amax):.3f} (< {AMAX_WARN:g}), {rate(records):,.0f} tokens/s")


def check_throughput(work: Path):
    import torch

    from auralm.data import datadir
    from auralm import tasks
    from auralm.training import config
    from bench._lockstep import LockStep
    from bench.train_throughput import clock_for, one_run

    dev = device()
    shape = dict(config.SIZES[RUN["model"]].to_dict(), batch=RUN["batch"], steps=RUN["steps"] // 2, warmup=3)
    meta = datadir.load_manifest(data_dir(work), "lm")
    train_set = tasks.open_split(data_dir(work), meta, "train", shape["block_size"])
    lock = LockStep(warmup=shape["warmup"], clock=clock_for(dev))
    torch.manual_seed(0)
    s = one_run(lock, data_dir(work), train_set, vocab(work), shape, work / "runs" / "throughput", device=dev,
                peers=("bare",))
    tokens = shape["batch"] * shape["block_size"]
    ratio = s["bare"] / s["trainer"]
    return result(ratio >= THROUGHPUT_MIN, f"trainer {tokens / s['trainer']:,.0f} tokens/s, bare loop "
                  f"{tokens / s['bare']:,.0f}: trainer/bare {ratio:.3f} (at least {THROUGHPUT_MIN:g}), fp32, "
                  f"{RUN['model']} batch {RUN['batch']}", ratio=ratio)


def peak_flops() -> tuple[float, str]:
    """The GPU's dense bf16 peak in FLOP/s and where it came from: PEAK_TFLOPS by name, else a measured matmul."""
    import torch

    name = "cpu" if SMOKE else torch.cuda.get_device_name(0)
    for fragment, tflops in PEAK_TFLOPS:
        if fragment in name:
            return tflops * 1e12, f"{name}: {tflops:g} TFLOP/s bf16 (table)"
    n, dev = (512 if SMOKE else 8192), device()
    a, b = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    clock = time.perf_counter
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0, reps = clock(), 5 if SMOKE else 20
    for _ in range(reps):
        a @ b
    if dev.type == "cuda":
        torch.cuda.synchronize()
    flops = 2 * n ** 3 * reps / (clock() - t0)
    return flops, f"{name}: {flops / 1e12:.1f} TFLOP/s bf16 (a measured {n}x{n} matmul: not in the table)"


def check_mfu(work: Path):
    path = work / "bf16.json"
    figures = json.loads(path.read_text()).get("figures") if path.exists() else None
    if not figures:
        return result(False, "needs the bf16 run's tokens/s (the bf16 check did not pass)")
    peak, where = peak_flops()
    mfu = 6 * figures["parameters"] * figures["tokens_per_s"] / peak
    return result(0 < mfu <= 1, f"6 x {figures['parameters'] / 1e6:.1f}M x {figures['tokens_per_s']:,.0f} tokens/s "
                  f"over {where}: MFU {100 * mfu:.2f}%", mfu=mfu)


CHECKS = {"data": check_data, "nvidia-smi": check_nvidia_smi, "bf16": check_bf16, "fp16": check_fp16,
          "nccl": check_nccl, "fsdp": check_fsdp, "memory": check_memory, "doctor": check_doctor, "mhc": check_mhc,
          "throughput": check_throughput, "mfu": check_mfu}
# each check's own cap (s); the budget caps them all together (run_all)
CAPS = {"data": 45, "nvidia-smi": 20, "bf16": 45, "fp16": 45, "nccl": 45, "fsdp": 75, "memory": 40, "doctor": 45,
        "mhc": 50, "throughput": 60, "mfu": 30}
if SMOKE:  # a CPU of this project's test machine is slower than any GPU at these
    CAPS = {k: 10 * v for k, v in CAPS.items()}


def one(name: str, work: Path) -> int:
    """`--one NAME`: run that check here and print its result line (also kept in WORK/NAME.json)."""
    try:
        status, detail, figures = CHECKS[name](work)
    except Exception as exc:  # a check that breaks is a failed check, with what broke
        said = (str(exc).strip().splitlines() or [""])[0][:300]
        status, detail, figures = FAIL, f"{type(exc).__name__}: {said}", {}
    doc = {"status": status, "detail": detail, "figures": figures}
    (work / f"{name}.json").write_text(json.dumps(doc))
    print(TAG + json.dumps(doc), flush=True)
    return 0


def found_gpu() -> tuple[bool, str]:
    """(a CUDA GPU torch can use, the line that says what was found)."""
    import torch

    if SMOKE:
        return True, f"the CPU (GPU_CHECK_SMOKE=1: a test of this script, figures meaningless), torch {torch.__version__}"
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return True, f"{torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda})"
    return False, f"no CUDA GPU found (torch {torch.__version__}: torch.cuda.is_available() is False): nothing to check"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated checks, of: " + ", ".join(CHECKS))
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all the checks together")
    p.add_argument("--work", type=Path, help="the directory for data and runs (default: a new temporary one)")
    p.add_argument("--one", choices=sorted(CHECKS), help=argparse.SUPPRESS)
    p.add_argument("--fsdp-worker", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.fsdp_worker:
        fsdp_worker(a.fsdp_worker)
        return 0
    if a.one:
        return one(a.one, a.work)
    gpu, line = found_gpu()
    if not gpu:
        from cli.setup import torch_build
        from node import setup as node_setup

        smi = torch_build.parse_nvidia_smi(node_setup.nvidia_smi())
        if smi:
            print(f"nvidia-smi shows {smi['gpus'][0]} (driver {smi['driver']}), but this torch cannot use it: {line}; "
                  "install the CUDA build of torch (`hrmctl setup` chooses it from nvidia-smi)")
            return 1
        print(line)
        return 0
    names = a.only.split(",") if a.only else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        p.error(f"unknown check(s) {', '.join(unknown)}; the checks: {', '.join(CHECKS)}")
    if "data" not in names:
        names.insert(0, "data")  # every run trains on it
    work = a.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    from rich.console import Console

    return report(run_all(names, a.budget, work), Console(), line)


if __name__ == "__main__":
    sys.exit(main())
