"""``training.parallel=fsdp``: the model sharded over the ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each rank keeps 1/world of every parameter (a DTensor shard), of its gradient and of the optimizer state;
the whole parameters of a block are all-gathered for its forward and backward and freed after, and the
gradients are reduce-scattered (averaged, like DDP's all-reduce) into the shards. The optimizer is made
after the sharding, on the DTensor parameters.

What is sharded as a unit (one ``fully_shard`` each, then the root for what is left: embeddings, final norm,
heads): the blocks of the GPT and RLM families (``model.blocks``) and of the sudoku transformer
(``model.layers``). The recurrent HRM/TRM models run their blocks several times per segment (and HRM runs the
core again for its Q target), so they are sharded as one unit, the root alone: the whole model is all-gathered
once per forward, and what is saved is the memory of the gradients and the optimizer state (and of the
parameters between steps).

Mixed precision follows ``training.dtype`` as autocast does: bf16 parameters in the forward and backward
with gradients reduced in fp32, or fp32 throughout. ``training.fsdp_cpu_offload=true`` keeps the shards
(parameters, gradients, optimizer state) in CPU memory (CPUOffloadPolicy), for a GPU too small for them; on
a CPU-only run it changes nothing (said in the log). Not tested on a GPU here (this machine has none).

A world of one has no process group: the model stays whole (nothing to shard), and the checkpoints are the
same sharded (DCP) kind, so a run can move between one rank and several.
"""

from __future__ import annotations

import torch
import torch.nn as nn


def units(model: nn.Module) -> list[nn.Module]:
    """The submodules sharded one by one before the root: the transformer blocks, where the model has a list
    of them that each run once per forward; [] for the recurrent models (the root alone)."""
    if getattr(model, "recurrent", False):
        return []
    for name in ("blocks", "layers"):
        blocks = getattr(model, name, None)
        if isinstance(blocks, nn.ModuleList):
            return list(blocks)
    return []


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model: nn.Module, bf16: bool, cpu_offload: bool, device: torch.device = torch.device("cpu")) -> str:
    """Shard ``model`` in place over the default process group; a phrase for the log. ``cpu_offload`` applies to
    an accelerator (the shards are moved to CPU memory between uses); on the CPU they are there already, and
    FSDP's CPUOffloadPolicy would refuse to start without an accelerator, so it is left out."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard, \
        register_fsdp_forward_method

    ignored = cpu_offload and device.type == "cpu"
    cpu_offload = cpu_offload and not ignored

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    kw = {"mp_policy": policy}
    if cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    blocks = units(model)
    for block in blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    # the entry points besides forward, which gather the shards too: the KV-cached generation's (the evaluation
    # samples) and the recurrent models' evaluation (ACT.solve runs the core itself, around forward)
    for module, method in [*((b, "cached") for b in blocks), (model, "step"), (model, "solve")]:
        if hasattr(module, method):
            register_fsdp_forward_method(module, method)
    what = f"{len(blocks)} blocks and the root" if blocks else "the whole model as one unit"
    return (f"fsdp: {what} sharded, {'bf16 compute with fp32 gradient reduction' if bf16 else 'fp32'}"
            f"{', shards offloaded to CPU memory' if cpu_offload else ''}"
            f"{NO_OFFLOAD if ignored else ''}")


def reshard(model: nn.Module) -> None:
    """Every unit of ``model`` back to its shards. FSDP keeps the root unit gathered after a forward without
    gradients (it expects the backward that does not come), and while gathered ``model.parameters()`` are the
    whole tensors, not the shards the optimizer steps."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


NO_OFFLOAD = " (training.fsdp_cpu_offload=true changes nothing on the CPU: the shards are in its memory)"


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: the local shard of a DTensor, else ``t`` itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t`` (a collective for a DTensor: every rank must call it)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def local_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """The bytes this rank holds of the parameters, their gradients and the optimizer state."""
    params = [p for p in model.parameters()]
    out = {"params": sum(local(p).numel() * local(p).element_size() for p in params),
           "grads": sum(local(p.grad).numel() * local(p.grad).element_size() for p in params if p.grad is not None),
           "optimizer": 0}
    if optimizer is not None:
        for s in optimizer.state.values():
            out["optimizer"] += sum(local(v).numel() * local(v).element_size() for v in s.values()
                                    if isinstance(v, torch.Tensor))
    out["total"] = out["params"] + out["grads"] + out["optimizer"]
    return out
