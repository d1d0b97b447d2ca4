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


def _cpu_flags() -> list[str]:
    try:
        return next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "").split()
    except OSError:
        return []


def cpu_has_bf16() -> bool:
    """Whether bf16 autocast beats fp32 on this CPU: where it has AMX (``amx_bf16``). AVX512-BF16 alone is not
    enough: on an AMD EPYC with it (Zen 4, 2 cores, torch 2.13, 2026-12-06) its bf16 matrix products were twice
    fp32's speed, but ``trm-tiny``'s training step took 1.77 s in bf16 against 0.88 s in fp32 and its evaluation
    about 10 times as long (py-spy put most of the time in the attention's forward)."""
    return "amx_bf16" in _cpu_flags()


def precision_said(t: config.TrainingConfig, device: torch.device) -> str:
    """The number format a run computes in, and why when ``dtype=auto`` chose it (for the run's first lines)."""
    if t.dtype != "auto":
        return f"{t.dtype} (training.dtype={t.dtype})"
    if device.type == "cuda":
        return "bf16 (training.dtype=auto: the GPU has bf16)" if bf16_compute(t, device) else \
            "fp32 (training.dtype=auto: the GPU has no bf16)"
    if bf16_compute(t, device):
        return "bf16 (training.dtype=auto: this CPU has AMX)"
    why = "AVX512-BF16 but no AMX, where bf16 is slower here" if "avx512_bf16" in _cpu_flags() else "no native bf16"
    return f"fp32 (training.dtype=auto: this CPU has {why}; training.dtype=bf16 to try it)"


def autocast(t: config.TrainingConfig, device: torch.device):
    """bf16 autocast when asked, or with ``dtype=auto`` on a CUDA device that supports it or a CPU with AMX;
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
