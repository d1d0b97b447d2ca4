"""The peer of bench/collectives.py: a plain torch.distributed all_reduce loop, run under torchrun.

What anyone would write by hand: float32 tensors from 1 KiB to 64 MiB, one warm-up op, an
iteration count from it (agreed across ranks), the slowest rank's time. Prints one JSON line.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.25
backend = "nccl" if os.environ.get("HRMCTL_BACKEND") == "nccl" else "gloo"  # hrmctl's choice for these nodes
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
if device.type == "cuda":
    torch.cuda.set_device(device)
dist.init_process_group(backend)
world = dist.get_world_size()


def sync() -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


rows = []
for size in [1024 * 4 ** i for i in range(9)]:
    t = torch.ones(size // 4, device=device)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    sync()
    est = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    iters = max(3, min(5000, int(seconds / max(est.item(), 1e-6))))
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    sync()
    per = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(per, op=dist.ReduceOp.MAX)
    algbw = size / per.item() / 1e9
    rows.append({"bytes": size, "iters": iters, "busbw_GBps": algbw * 2 * (world - 1) / world})
if dist.get_rank() == 0:
    print("PLAIN " + json.dumps(rows), flush=True)
dist.destroy_process_group()
