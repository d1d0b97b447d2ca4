"""training.parallel=fsdp against ddp, in one run: the bytes each rank holds of parameters, gradients and optimizer
state after an optimizer step, and the time of a training step, for model=small (task=lm, GPT) on 2 gloo ranks.

    python bench/fsdp_memory.py [--model small] [--steps 6] [--batch 4] [--seq 256] [--vocab 8192] [--lab]

With ``--lab`` (root) the two ranks run on two lab nodes (lab/nodes.py: real sshd, network namespaces, each
node pinned to a core of its own), started over SSH, gloo between them over the lab's bridge; without it,
two local processes over loopback.

The model, its sharding (auralm.parallel.fsdp.shard) and the optimizer (auralm.training.optim) are the trainer's own;
the
data is random tokens. Bytes are counted from the tensors (a DTensor counts its local shard), not from the
process's memory, which also holds the Python runtime, activations and allocator caches.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rank(rank: int, world: int, port: int, mode: str, a: dict, out: str, master: str = "127.0.0.1") -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR=master, MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from auralm import models
    from auralm.training import config, optim
    from auralm.parallel import fsdp

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    cfg = config.parse([f"model={a['model']}", "task=lm"])
    raw = models.build("lm", config.resolved_model(cfg.model), a["vocab"])
    if mode == "fsdp":
        fsdp.shard(raw, bf16=False, cpu_offload=False)
        model = raw
    else:
        model = DDP(raw)
    opt = optim.make_optimizer(raw, cfg.training, torch.device("cpu"))
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(a["steps"]):
        x = torch.randint(0, a["vocab"], (a["batch"], a["seq"]), generator=g)
        dist.barrier()
        began = time.perf_counter()
        _, loss = model(x, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in raw.parameters()], 1.0)
        opt.step()
        times.append(time.perf_counter() - began)
        if step < a["steps"] - 1:
            opt.zero_grad(set_to_none=True)
    held = fsdp.local_bytes(raw, opt)
    with open(Path(out) / f"{mode}{rank}.json", "w") as f:
        json.dump({"bytes": held, "step_s": sorted(times[1:])[len(times[1:]) // 2]}, f)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="small")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--lab", action="store_true", help="the ranks on lab nodes (root)")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # one rank of a --lab run, on its node:
    p.add_argument("--master", help=argparse.SUPPRESS)  # rank 0's address,
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)  # its port,
    p.add_argument("--mode", help=argparse.SUPPRESS)  # ddp or fsdp,
    p.add_argument("--out", help=argparse.SUPPRESS)  # where it writes its figures
    a = vars(p.parse_args())
    if a["rank"] is not None:
        _rank(a["rank"], a["world"], a["port"], a["mode"], a, a["out"], a["master"])
        return
    out = tempfile.mkdtemp()
    os.chmod(out, 0o777)  # --lab: the nodes' users write their figures here
    lab = _lab(a["world"]) if a["lab"] else None
    try:
        result = _measure(a, out, lab)
    finally:
        if lab is not None:
            lab.down()
    _report(a, result, "on two lab nodes" if lab else "on this machine")


def _lab(world: int):
    from _handrun import pin_nodes
    from lab.nodes import Lab

    lab = Lab(world)
    lab.up()
    pin_nodes(lab)
    return lab


def _measure(a: dict, out: str, lab) -> dict:
    from _handrun import ssh_popen

    result = {}
    for mode in ("ddp", "fsdp"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if lab is None:
            mp.start_processes(_rank, args=(a["world"], port, mode, a, out), nprocs=a["world"],
                               start_method="spawn")
        else:
            flags = " ".join(f"--{k} {a[k]}" for k in ("model", "steps", "batch", "seq", "vocab", "world"))
            procs = [ssh_popen(lab, n.name, f"cd ~/hrmctl && {lab.python} bench/fsdp_memory.py {flags} --rank {r} "
                                            f"--master {lab.nodes[0].ip} --port {port} --mode {mode} --out {out}")
                     for r, n in enumerate(lab.nodes)]
            for proc in procs:
                text = proc.communicate()[0]
                if proc.returncode:
                    raise SystemExit(f"a rank failed ({proc.returncode}): {text[-800:]}")
        ranks = [json.loads((Path(out) / f"{mode}{r}.json").read_text()) for r in range(a["world"])]
        result[mode] = {"bytes_per_rank": [r["bytes"] for r in ranks],
                        "step_s": max(r["step_s"] for r in ranks)}
    return result


def _report(a: dict, result: dict, where: str) -> None:
    mb = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    for mode in ("ddp", "fsdp"):
        for r, b in enumerate(result[mode]["bytes_per_rank"]):
            print(f"{mode} rank {r}: params {mb(b['params'])}, grads {mb(b['grads'])}, optimizer {mb(b['optimizer'])}"
                  f" = {mb(b['total'])}")
        print(f"{mode}: median step {result[mode]['step_s']:.3f} s (slowest rank)")
    ratio = max(b["total"] for b in result["fsdp"]["bytes_per_rank"]) / \
        max(b["total"] for b in result["ddp"]["bytes_per_rank"])
    print(f"model={a['model']}, {a['world']} ranks {where}, batch {a['batch']} x {a['seq']} tokens a rank: fsdp holds "
          f"{ratio:.3f}x of ddp's bytes per rank (params + grads + optimizer state); step time fsdp/ddp "
          f"{result['fsdp']['step_s'] / result['ddp']['step_s']:.2f}x")


if __name__ == "__main__":
    main()
