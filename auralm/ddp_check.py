"""The DDP self-test that torchrun runs on every node: `python -m auralm.ddp_check`.

1. Every rank reports host, backend and device.
2. Correctness: all_reduce (sum of rank-dependent values), broadcast, all_gather and barrier;
   every rank checks what it received, and the verdict is agreed by one more all_reduce.
3. Speed: all_reduce algorithm and bus bandwidth for sizes from 1 KiB to 64 MiB
   (busbw = algbw * 2(n-1)/n, as nccl-tests define it) and small-message latency.

Rank 0 prints a table and one line `HRMCTL_RESULT {json}` that `hrmctl test-ddp` reads.
Exit code: 0 when every check passed on every rank, 1 when any result was wrong.
Works alone (world of one) and under torchrun; the backend comes from --backend, else
HRMCTL_BACKEND (the launcher's choice), else NCCL when CUDA is usable, else gloo.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

RESULT_TAG = "HRMCTL_RESULT "
KIB = 1024
DEFAULT_SIZES = [KIB * 4 ** i for i in range(9)]  # 1 KiB, 4 KiB, ... 64 MiB


def parse_size(text: str) -> int:
    units = {"k": KIB, "m": KIB ** 2, "g": KIB ** 3}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = units.get(t[-1:], 1)
    num = t[:-1] if t[-1:] in units else t
    return int(float(num) * mult)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m auralm.ddp_check", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default=None)
    p.add_argument("--min-size", default="1KiB")
    p.add_argument("--max-size", default="64MiB")
    p.add_argument("--seconds", type=float, default=0.25,
                   help="target time per message size (the iteration count is agreed across ranks)")
    p.add_argument("--max-iters", type=int, default=200)
    p.add_argument("--latency-iters", type=int, default=100)
    p.add_argument("--no-bandwidth", action="store_true", help="correctness only")
    p.add_argument("--no-table", action="store_true", help="only the HRMCTL_RESULT line (hrmctl draws the table)")
    p.add_argument("--corrupt-rank", type=int, default=None,
                   help="fault injection: this rank's all_reduce result is falsified, to see the check fail")
    p.add_argument("--soak", type=float, default=0.0,
                   help="after the checks, keep checking all_reduce for this many seconds (a network soak)")
    return p.parse_args(argv)


def choose_backend(requested: str | None) -> str:
    want = requested or os.environ.get("HRMCTL_BACKEND") or "auto"
    if want == "auto":
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    return want


def init(backend: str) -> tuple[int, int, torch.device]:
    if "RANK" not in os.environ:  # alone, outside torchrun: a world of one on a free local port
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=120))
    return dist.get_rank(), dist.get_world_size(), device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_correctness(rank: int, world: int, device: torch.device, corrupt: bool = False) -> dict[str, bool]:
    ok: dict[str, bool] = {}
    n = 1000
    base = torch.arange(n, dtype=torch.float64, device=device)
    t = base * (rank + 1)
    dist.all_reduce(t)
    if corrupt:
        t[n // 2] += 1
    ok["all_reduce"] = bool(torch.equal(t, base * (world * (world + 1) / 2)))

    b = base + 7 if rank == 0 else torch.full((n,), -1.0, dtype=torch.float64, device=device)
    dist.broadcast(b, src=0)
    ok["broadcast"] = bool(torch.equal(b, base + 7))

    mine = torch.tensor([rank * 10 + 3, rank], dtype=torch.int64, device=device)
    gathered = [torch.zeros(2, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine)
    ok["all_gather"] = all(g.tolist() == [r * 10 + 3, r] for r, g in enumerate(gathered))

    # barrier: every rank bumps a counter before it, and after it each must see all of them
    before = torch.ones(1, device=device)
    dist.all_reduce(before)
    dist.barrier()
    ok["barrier"] = int(before.item()) == world
    return ok


def agree(ok: dict[str, bool], device: torch.device) -> dict[str, list[int]]:
    """Which ranks failed each check (every rank learns the same answer)."""
    world = dist.get_world_size()
    out = {}
    for name, good in ok.items():
        flags = torch.zeros(world, dtype=torch.int32, device=device)
        flags[dist.get_rank()] = 0 if good else 1
        dist.all_reduce(flags)
        out[name] = [r for r in range(world) if flags[r].item()]
    return out


def _timed_all_reduce(t: torch.Tensor, iters: int, device: torch.device) -> float:
    """Seconds per all_reduce on the slowest rank."""
    dist.barrier()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    sync(device)
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def bandwidth(sizes: list[int], world: int, device: torch.device, seconds: float, max_iters: int) -> list[dict]:
    rows = []
    factor = 2 * (world - 1) / world if world > 1 else 0.0
    for size in sizes:
        t = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        per = _timed_all_reduce(t, 1, device)  # warm-up, and a first guess of the time per op
        iters = max(3, min(max_iters, int(seconds / max(per, 1e-6))))
        per = _timed_all_reduce(t, iters, device)
        algbw = size / per / 1e9
        rows.append({"bytes": size, "iters": iters, "time_us": per * 1e6,
                     "algbw_GBps": algbw, "busbw_GBps": algbw * factor})
    return rows


def latency(device: torch.device, iters: int) -> dict:
    t = torch.ones(1, dtype=torch.float32, device=device)
    for _ in range(5):
        dist.all_reduce(t)
    samples = []
    dist.barrier()
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        sync(device)
        samples.append(time.perf_counter() - t0)
    samples.sort()
    mine = torch.tensor([samples[len(samples) // 2], sum(samples) / len(samples)], dtype=torch.float64,
                        device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return {"bytes": 4, "iters": iters, "p50_us": mine[0].item() * 1e6, "mean_us": mine[1].item() * 1e6}


def soak(seconds: float, world: int, device: torch.device) -> bool:
    """all_reduce rank-dependent values for `seconds` (the same number of rounds on every rank)."""
    good = True
    base = torch.arange(4096, dtype=torch.float64, device=device)
    deadline = time.monotonic() + seconds
    while True:
        t = base * (dist.get_rank() + 1)
        dist.all_reduce(t)
        good &= bool(torch.equal(t, base * (world * (world + 1) / 2)))
        go = torch.tensor([1 if time.monotonic() < deadline else 0], device=device)
        dist.all_reduce(go, op=dist.ReduceOp.MIN)
        if not go.item():
            return good
        time.sleep(0.05)


def table(result: dict) -> str:
    lines = [f"world {result['world_size']}, backend {result['backend']}"]
    for r in result["ranks"]:
        lines.append(f"  rank {r['rank']}: host {r['host']}, device {r['device']}, torch {r['torch']}")
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
    return "\n".join(lines)


def size_label(n: int) -> str:
    return f"{n // KIB ** 2} MiB" if n >= KIB ** 2 else f"{n // KIB} KiB" if n >= KIB else f"{n} B"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = choose_backend(args.backend)
    rank, world, device = init(backend)
    try:
        me = {"rank": rank, "host": socket.gethostname(), "device": str(device), "torch": torch.__version__,
              "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
        ranks: list = [None] * world
        dist.all_gather_object(ranks, me)
        checks = agree(check_correctness(rank, world, device, corrupt=args.corrupt_rank == rank), device)
        lo, hi = parse_size(args.min_size), parse_size(args.max_size)
        sizes = [s for s in DEFAULT_SIZES if lo <= s <= hi] or [lo]
        bw = [] if args.no_bandwidth else bandwidth(sizes, world, device, args.seconds, args.max_iters)
        lat = None if args.no_bandwidth else latency(device, args.latency_iters)
        if args.soak > 0:
            checks.update(agree({"soak": soak(args.soak, world, device)}, device))
        wrong = any(checks.values())
        result = {"world_size": world, "backend": backend, "ranks": ranks, "checks": checks,
                  "ok": not wrong, "bandwidth": bw, "latency": lat}
        if rank == 0:
            if not args.no_table:
                print(table(result), flush=True)
            print(RESULT_TAG + json.dumps(result), flush=True)
        return 1 if wrong else 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
