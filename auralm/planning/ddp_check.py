"""The DDP self-test that torchrun runs on every node: `python -m auralm.planning.ddp_check`.

1. Every rank reports host, backend and device.
2. Correctness: all_reduce (sum of rank-dependent values), broadcast, all_gather and barrier;
   every rank checks what it received, and the verdict is agreed by one more all_reduce.
3. Speed: all_reduce algorithm and bus bandwidth for sizes from 1 KiB to 64 MiB
   (busbw = algbw * 2(n-1)/n, as nccl-tests define it) and small-message latency.
4. What that means for training (auralm.planning.link_budget): the trainer's model (its default, or the
   ``key=value`` overrides given, parsed by auralm.training.config) timed for a few forward+backward+optimizer
   steps on random inputs of the right shape on every rank (the slowest rank's median: every DDP
   step waits for it), against the predicted communication of DDP, DDP with the bf16 hook and
   DiLoCo, and the suggestion. Skipped with --no-bandwidth.

Rank 0 prints a table and one line `HRMCTL_RESULT {json}` that `hrmctl test-ddp` reads.
Exit code: 0 when every check passed on every rank, 1 when any result was wrong.
Works alone (world of one) and under torchrun. The backend is agreed by all ranks as the trainer
does it (auralm.training.distributed): the request (--backend, else HRMCTL_BACKEND, the launcher's choice,
else auto) is gloo, or NCCL only when every rank has CUDA and NCCL and NCCL starts on every rank;
otherwise gloo on all, with the reason (naming the rank) in the report.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from auralm import tasks
from auralm.planning import link_budget
from auralm.training import command_line, config, distributed
from auralm.training.distributed import Dist
from auralm.errors import UserError

RESULT_TAG = "HRMCTL_RESULT "
TIMEOUT_S = 120
KIB = 1024
DEFAULT_SIZES = [KIB * 4 ** i for i in range(9)]  # 1 KiB, 4 KiB, ... 64 MiB
PROBE_SECONDS = 2.0  # each rank times steps for about this long (at least one, after one warm-up step)
PROBE_MAX_STEPS = 8


def parse_size(text: str) -> int:
    units = {"k": KIB, "m": KIB ** 2, "g": KIB ** 3}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = units.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in units else t
    return int(float(num) * mult)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m auralm.planning.ddp_check", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default=None,
                   help="gloo, or nccl if every rank can (else gloo on all, the reason reported); "
                        "default: HRMCTL_BACKEND, else auto")
    p.add_argument("--min-size", default="1KiB")
    p.add_argument("--max-size", default="64MiB")
    p.add_argument("--seconds", type=float, default=0.25,
                   help="target time per message size (the iteration count is agreed across ranks)")
    p.add_argument("--max-iters", type=int, default=5000,
                   help="cap on the iterations per size (small messages then still run for --seconds)")
    p.add_argument("--latency-iters", type=int, default=100)
    p.add_argument("--no-bandwidth", action="store_true", help="correctness only")
    p.add_argument("--no-table", action="store_true", help="only the HRMCTL_RESULT line (hrmctl draws the table)")
    p.add_argument("--corrupt-rank", type=int, default=None,
                   help="fault injection: this rank's all_reduce result is falsified, to see the check fail")
    p.add_argument("--soak", type=float, default=0.0,
                   help="after the checks, keep checking all_reduce for this many seconds (a network soak)")
    p.add_argument("--probe-seconds", type=float, default=PROBE_SECONDS,
                   help="time the trainer's model for about this long on every rank (0: not at all)")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="the trainer's overrides for the model whose compute is timed (e.g. model=small task=lm "
                        "training.batch_size=16); default: the trainer's default model")
    return p.parse_args(argv)


def init(requested: str | None) -> Dist:
    """Join the world and agree on the backend; d.group and d.device are what the checks use."""
    if "RANK" not in os.environ:  # alone, outside torchrun: a world of one on a free local port
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    d = distributed.setup(requested or "auto", TIMEOUT_S, group_of_one=True)
    if d.backend != "nccl":
        d.device = torch.device("cpu")  # gloo: host memory, so the network is measured, not copies
    return d


def sync(d: Dist) -> None:
    if d.device.type == "cuda":
        torch.cuda.synchronize(d.device)


def check_correctness(d: Dist, corrupt: bool = False) -> dict[str, bool]:
    ok: dict[str, bool] = {}
    n, rank, world, device, group = 1000, d.rank, d.world, d.device, d.group
    base = torch.arange(n, dtype=torch.float64, device=device)
    t = base * (rank + 1)
    dist.all_reduce(t, group=group)
    if corrupt:
        t[n // 2] += 1
    ok["all_reduce"] = bool(torch.equal(t, base * (world * (world + 1) / 2)))

    b = base + 7 if rank == 0 else torch.full((n,), -1.0, dtype=torch.float64, device=device)
    dist.broadcast(b, src=0, group=group)
    ok["broadcast"] = bool(torch.equal(b, base + 7))

    mine = torch.tensor([rank * 10 + 3, rank], dtype=torch.int64, device=device)
    gathered = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    ok["all_gather"] = all(g.tolist() == [r * 10 + 3, r] for r, g in enumerate(gathered))

    # barrier: every rank bumps a counter before it, and after it each must see all of them
    before = torch.ones(1, device=device)
    dist.all_reduce(before, group=group)
    dist.barrier(group=group)
    ok["barrier"] = int(before.item()) == world
    return ok


def agree(ok: dict[str, bool], d: Dist) -> dict[str, list[int]]:
    """Which ranks failed each check (every rank learns the same answer)."""
    out = {}
    for name, good in ok.items():
        flags = torch.zeros(d.world, dtype=torch.int32, device=d.device)
        flags[d.rank] = 0 if good else 1
        dist.all_reduce(flags, group=d.group)
        out[name] = [r for r in range(d.world) if flags[r].item()]
    return out


def _timed_all_reduce(t: torch.Tensor, iters: int, d: Dist) -> float:
    """Seconds per all_reduce on the slowest rank."""
    dist.barrier(group=d.group)
    sync(d)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=d.group)
    sync(d)
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=d.device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=d.group)
    return float(elapsed.item())


def bandwidth(sizes: list[int], d: Dist, seconds: float, max_iters: int) -> list[dict]:
    rows = []
    factor = 2 * (d.world - 1) / d.world if d.world > 1 else 0.0
    for size in sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=d.device)
        per = _timed_all_reduce(t, 1, d)  # warm-up, and a first guess of the time per op
        iters = max(3, min(max_iters, int(seconds / max(per, 1e-6))))
        per = _timed_all_reduce(t, iters, d)
        algbw = size / per / 1e9
        rows.append({"bytes": size, "iters": iters, "time_us": per * 1e6,
                     "algbw_GBps": algbw, "busbw_GBps": algbw * factor})
    return rows


def latency(d: Dist, iters: int) -> dict:
    t = torch.ones(1, dtype=torch.float32, device=d.device)
    for _ in range(5):
        dist.all_reduce(t, group=d.group)
    samples = []
    dist.barrier(group=d.group)
    for _ in range(iters):
        sync(d)
        t0 = time.perf_counter()
        dist.all_reduce(t, group=d.group)
        sync(d)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    mine = torch.tensor([samples[len(samples) // 2], sum(samples) / len(samples)], dtype=torch.float64,
                        device=d.device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=d.group)
    return {"bytes": 4, "iters": iters, "p50_us": mine[0].item() * 1e6, "mean_us": mine[1].item() * 1e6}


def soak(seconds: float, d: Dist) -> bool:
    """all_reduce rank-dependent values for `seconds` (the same number of rounds on every rank)."""
    good = True
    base = torch.arange(4096, dtype=torch.float64, device=d.device)
    deadline = time.monotonic() + seconds
    while True:
        t = base * (d.rank + 1)
        dist.all_reduce(t, group=d.group)
        good &= bool(torch.equal(t, base * (d.world * (d.world + 1) / 2)))
        go = torch.tensor([1 if time.monotonic() < deadline else 0], device=d.device)
        dist.all_reduce(go, op=dist.ReduceOp.MIN, group=d.group)
        if not go.item():
            return good
        time.sleep(0.05)


def compute_probe(cfg: config.Config, model: dict, d: Dist, seconds: float) -> dict:
    """The trainer's model, built as the trainer builds it, timed on every rank at once for one optimizer step of
    random inputs (forward, backward, optimizer; after one warm-up step): {"steps_timed", "s_per_micro_batch" (the
    slowest rank's median), "s_by_rank", "s_per_step" (x grad_accum), "s_per_step_by_rank", "error"}. Each rank times
    steps for about
    ``seconds`` (at least one, three when they fit in twice that, at most PROBE_MAX_STEPS); "steps_timed" is the
    fewest any rank timed."""
    t = cfg.training
    out = {"steps_timed": 0, "s_per_micro_batch": None, "s_by_rank": None, "s_per_step": None,
           "s_per_step_by_rank": None, "error": None}
    error = None
    try:
        from auralm import models
        from auralm.training import objective, optim
        from auralm.training.precision import autocast

        torch.manual_seed(t.seed)
        raw = models.build(cfg.task, config.resolved_model(cfg.model), model["vocab"]).to(d.device)
        raw.set_grad_checkpointing(t.grad_checkpoint)
        opt = optim.make_optimizer(raw, t, d.device)
        loss_of = objective.make(raw, cfg)
        x, y = tasks.get(cfg.task).random_batch(config.resolved_model(cfg.model), model["vocab"], t.batch_size,
                                                d.device)

        def one(rows: int | None = None) -> float:
            sync(d)
            t0 = time.perf_counter()
            with autocast(t, d.device):
                loss, _ = loss_of.loss(raw, x[:rows], y[:rows], 0)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync(d)
            return time.perf_counter() - t0

        one(2)  # warm-up on two rows (cheap): the first call's one-time costs
        loss_of.reset()
    except Exception as e:  # a model that cannot be built or run here: reported, the other checks stand
        error = f"{type(e).__name__}: {e}".splitlines()[0]
    errors = distributed.gather_object(d, error)
    if any(errors):
        r = next(i for i, e in enumerate(errors) if e)
        out["error"] = f"rank {r}: {errors[r]}"
        return out
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < PROBE_MAX_STEPS:  # about `seconds`, but three steps (a median) if they fit in twice that
        elapsed = time.perf_counter() - began
        if times and elapsed >= seconds and (len(times) >= 3 or elapsed >= 2 * seconds):
            break
        times.append(one())
    times.sort()
    mid = len(times) // 2
    mine = torch.zeros(d.world, dtype=torch.float64, device=d.device)
    mine[d.rank] = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
    dist.all_reduce(mine, group=d.group)  # each rank filled its own slot: every rank's median on every rank
    least = torch.tensor([len(times)], dtype=torch.int64, device=d.device)
    dist.all_reduce(least, op=dist.ReduceOp.MIN, group=d.group)
    steps = int(least.item())
    by_rank = mine.tolist()
    out.update(steps_timed=steps, s_by_rank=by_rank, s_per_micro_batch=max(by_rank),
               s_per_step=max(by_rank) * t.grad_accum, s_per_step_by_rank=[s * t.grad_accum for s in by_rank])
    return out


def training_section(cfg: config.Config, d: Dist, bw: list[dict], lat: dict, seconds: float) -> dict:
    """The link budget (auralm.planning.link_budget) for the trainer's model on this world, with the model and its
    compute."""
    model = link_budget.run_model(cfg, d.world)
    compute = compute_probe(cfg, model, d, seconds) if seconds > 0 else {
        "steps_timed": 0, "s_per_micro_batch": None, "s_by_rank": None, "s_per_step": None,
        "s_per_step_by_rank": None, "error": "not timed"}
    link = link_budget.link_from_rows(bw)
    busbw, at = link if link else (0.0, 0)
    b = link_budget.budget(busbw_GBps=busbw, latency_us=lat["p50_us"], world=d.world, parameters=model["parameters"],
                           compute_s=compute["s_per_step"], powersgd=model["powersgd"],
                           compute_by_rank=compute["s_per_step_by_rank"], max_steps=model["max_steps"])
    return {**b, "bandwidth_bytes": at, "model": model, "compute": compute}


def training_lines(tr: dict) -> list[str]:
    """The link budget as text lines (ddp_check's own table)."""
    m, c = tr["model"], tr["compute"]
    timed = (f"median of {c['steps_timed']} timed step(s) on the slowest rank" if c["steps_timed"]
             else f"not timed: {c['error']}")
    lines = [f"  training: model {m['name']} ({m['task']}), {m['parameters'] / 1e6:.2f}M parameters, batch "
             f"{m['batch_size']} x grad_accum {m['grad_accum']} per rank; compute "
             f"{link_budget.seconds(tr['compute_s'])} per step ({timed})",
             f"  {'sync':<30} {'bytes/step':>12} {'comm s/step':>12} {'compute s/step':>15} {'comm/compute':>13}"]
    for label, nbytes, comm, compute, ratio in link_budget.rows(tr):
        ratio = "-" if ratio is None else f"{ratio:.3f}"
        lines.append(f"  {label:<30} {link_budget.human_bytes(nbytes):>12} {link_budget.seconds(comm):>12} "
                     f"{link_budget.seconds(compute):>15} {ratio:>13}")
    if tr.get("balance"):
        lines.append("  " + link_budget.shares_line(tr["balance"]))
    lines.append("  " + link_budget.suggestion_line(tr["suggestion"]))
    return lines


def table(result: dict) -> str:
    lines = [f"world {result['world_size']}, backend {result['backend']} ({result['reason']})"]
    for r in result["ranks"]:
        lines.append(f"  rank {r['rank']}: host {r['host']}, device {r['device']}, torch {r['torch']}, "
                     f"backend {r['backend']}")
    for name, bad in result["checks"].items():
        lines.append(f"  {name:<10} {'ok' if not bad else 'WRONG on ranks ' + ','.join(map(str, bad))}")
    if result.get("bandwidth"):
        lines.append(f"  {'size':>10} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}")
        for row in result["bandwidth"]:
            lines.append(f"  {size_label(row['bytes']):>10} {row['time_us']:>10.1f} {row['algbw_GBps']:>11.3f} "
                         f"{row['busbw_GBps']:>11.3f}")
    if result.get("latency"):
        lat = result["latency"]
        lines.append(f"  latency (4 B all_reduce): p50 {lat['p50_us']:.1f} us, mean {lat['mean_us']:.1f} us")
    if result.get("training"):
        lines += training_lines(result["training"])
    return "\n".join(lines)


def size_label(n: int) -> str:
    return f"{n // KIB ** 2} MiB" if n >= KIB ** 2 else f"{n // KIB} KiB" if n >= KIB else f"{n} B"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = command_line.parse(args.overrides)
        if cfg.training.batch_size == config.AUTO:
            raise UserError("training.batch_size=auto is the trainer's: the self-test times a given batch, e.g. "
                            "training.batch_size=16")
        d = init(args.backend)
    except UserError as e:  # bad overrides, a bad HRMCTL_BACKEND
        if os.environ.get("RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        me = {"rank": d.rank, "host": d.host, "device": str(d.device), "torch": torch.__version__,
              "local_rank": d.local_rank, "backend": d.backend, "reason": d.reason}
        ranks = distributed.gather_object(d, me)
        checks = agree(check_correctness(d, corrupt=args.corrupt_rank == d.rank), d)
        lo, hi = parse_size(args.min_size), parse_size(args.max_size)
        sizes = [s for s in DEFAULT_SIZES if lo <= s <= hi] or [lo]
        bw = [] if args.no_bandwidth else bandwidth(sizes, d, args.seconds, args.max_iters)
        lat = None if args.no_bandwidth else latency(d, args.latency_iters)
        training = None if args.no_bandwidth else training_section(cfg, d, bw, lat, args.probe_seconds)
        if args.soak > 0:
            checks.update(agree({"soak": soak(args.soak, d)}, d))
        wrong = any(checks.values())
        result = {"world_size": d.world, "backend": d.backend, "requested": d.requested, "reason": d.reason,
                  "ranks": ranks, "checks": checks, "ok": not wrong, "bandwidth": bw, "latency": lat,
                  "training": training}
        if d.rank == 0:
            if not args.no_table:
                print(table(result), flush=True)
            print(RESULT_TAG + json.dumps(result), flush=True)
        return 1 if wrong else 0
    finally:
        distributed.teardown(d)


if __name__ == "__main__":
    distributed.exit_process(main())
