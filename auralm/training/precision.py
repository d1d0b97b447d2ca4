"""The number format a step computes in (bf16/fp16 autocast or fp32) and this rank's random state.

Holds ``autocast`` and ``bf16_compute`` (``training.dtype``), and ``rng_state``/``set_rng_state``, which the
trainer saves per rank in checkpoints and which the probes (batch sizing, speed, DDP's buckets) put back.
Imports torch and auralm.training.config only: the trainer (auralm.training.train) and the sync strategies
(auralm.parallel) use it.
"""

from __future__ import annotations

import contextlib

import torch

from auralm.training import config


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), where bf16 autocast is faster than fp32."""
    try:
        flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def autocast(t: config.TrainingConfig, device: torch.device):
    """bf16 autocast when asked, or with ``dtype=auto`` on a CUDA device that supports it or a CPU with native bf16;
    fp16 autocast with ``dtype=fp16`` (its gradients go through a GradScaler: see auralm.parallel.single)."""
    if t.dtype == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16_compute(t, device) else contextlib.nullcontext()


def bf16_compute(t: config.TrainingConfig, device: torch.device) -> bool:
    """Whether the forward and backward run in bf16 (``dtype=bf16``, or ``auto`` where the device has it)."""
    if t.dtype == "fp16":
        return False
    native = torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_has_bf16()
    return t.dtype == "bf16" or (t.dtype == "auto" and native)


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
