"""DDP's gradient compression, ``training.ddp_comm_hook=bf16|fp16|powersgd``.

bf16 and fp16 halve the bytes of every gradient bucket; PowerSGD (Vogels et al. 2019) sends two
low-rank factors per matrix (``training.powersgd_rank``) and keeps the error it made for the next
step (error feedback). On NCCL these are PyTorch's own hooks. PyTorch refuses its bf16 hook on
anything but NCCL (it checks the hook's name), though gloo all-reduces bf16 tensors: on gloo the
same compression is done by ``bf16_gloo_hook`` below.

A resumed run with bf16 or fp16 continues exactly. PowerSGD's error feedback and factors start
afresh at a resume: they live in DDP's gradient buckets, whose layout DDP rebuilds after the first
step of every run, so the saved ones would not fit the buckets of the resumed run's first step.
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from auralm.distributed import Dist


# no `from __future__ import annotations` here: DDP checks the hook's annotations as objects
def bf16_gloo_hook(process_group, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The bucket as bf16 on the wire, averaged, cast back: torch's bf16_compress_hook, for gloo."""
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(f):
        buffer.copy_(f.value()[0])
        return buffer

    return fut.then(decompress)


def register(model, name: str, d: Dist, *, rank: int, start_iter: int, seed: int):
    """Register the hook ``name`` on the DDP ``model``; its state (PowerSGD's), or None."""
    if name == "none":
        return None
    if name == "bf16":
        model.register_comm_hook(d.group, default_hooks.bf16_compress_hook if d.backend == "nccl" else bf16_gloo_hook)
        return None
    if name == "fp16":
        model.register_comm_hook(d.group, default_hooks.fp16_compress_hook)
        return None
    state = powerSGD_hook.PowerSGDState(process_group=d.group, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=max(2, start_iter), random_seed=seed)
    model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return state


def reset(state) -> None:
    """Forget the error feedback and the factors (after a skipped step: they may hold non-finite values)."""
    if state is not None:
        for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
            getattr(state, name).clear()
