"""Which backend the world gets, and why: NCCL only when every rank has a CUDA device and NCCL."""

from __future__ import annotations

from typing import Any


def choose_backend(probes: dict[str, Any]) -> tuple[str, str]:
    """probes: node name -> NodeProbe (all nodes of the world). Returns (backend, one-line reason)."""
    if not probes:
        return "gloo", "no node was probed"
    missing = [n for n, p in probes.items() if not p.nccl_usable]
    if not missing:
        return "nccl", "every node has CUDA and NCCL"
    why = []
    for n in missing:
        p = probes[n]
        if p.torch_version is None:
            why.append(f"{n}'s torch still importing" if getattr(p, "torch_importing_s", None) is not None
                       else f"{n} has no torch")
        elif p.cuda_devices == 0:
            why.append(f"{n} has no CUDA device")
        else:
            why.append(f"{n}'s torch has no NCCL")
    return "gloo", "gloo for the whole world: " + ", ".join(why)
