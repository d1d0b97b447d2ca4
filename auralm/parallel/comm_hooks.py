"""DDP's gradient compression, ``training.ddp_comm_hook=bf16|fp16|powersgd``.

bf16 and fp16 halve the bytes of every gradient bucket; PowerSGD (Vogels et al. 2019) sends two
low-rank factors per matrix (``training.powersgd_rank``) and keeps the error it made for the next
step (error feedback). On NCCL these are PyTorch's own hooks. PyTorch refuses its bf16 hook on
anything but NCCL (it checks the hook's name), though gloo all-reduces bf16 tensors: on gloo the
same compression is done by ``bf16_gloo_hook`` below.

A resumed run with bf16 or fp16 continues exactly, and with PowerSGD too: every rank's error feedback,
factors, step count and random generator go into the checkpoint (``state_dict``). They are kept per
gradient bucket of DDP, whose layout DDP builds anew in every run: one bucket at the first step, then
the buckets in the order the gradients became ready. So a resumed run first lets DDP see one backward
pass (``auralm.parallel.ddp.DataParallel.prime_buckets``: the first batch, a loss times zero, nothing stepped, the
random
state and carries put back), which gives the same buckets the saved state was kept in, and only then
loads the state (``load_state_dict``).
"""

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from auralm.training.distributed import Dist


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


SAVED = ("iter", "error_dict", "p_memory_dict", "q_memory_dict", "total_numel_before_compression",
         "total_numel_after_compression", "next_stats_report")


def state_dict(state) -> dict | None:
    """This rank's PowerSGD state for a checkpoint (the error feedback is its own), or None for the other hooks."""
    if state is None:
        return None
    out = {name: getattr(state, name) for name in SAVED}
    kind, keys, pos, has_gauss, gauss = state.rng.get_state()  # numpy's: as tensors and numbers, which a
    out["rng"] = {"kind": kind, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),  # checkpoint
                  "has_gauss": int(has_gauss), "gauss": float(gauss)}  # loads without unpickling code
    return out


def load_state_dict(state, saved: dict) -> None:
    """Back into ``state``, once DDP's buckets are laid out as when it was saved (see the module's text)."""
    for name in SAVED:
        setattr(state, name, saved[name])
    r = saved["rng"]
    state.rng.set_state((r["kind"], r["keys"].numpy().astype("uint32"), r["pos"], r["has_gauss"], r["gauss"]))
