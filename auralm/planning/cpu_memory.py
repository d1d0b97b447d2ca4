"""Keep freed memory in the process on CPU, so a training step does not page-fault its tensors back in.

A CPU training step frees and allocates again the same large tensors (activations, logits,
gradients) every step. glibc's malloc serves large blocks with ``mmap`` and gives them back to
the kernel on ``free``, and trims the heap top likewise, so every step faults the same pages in
again and the kernel zeroes them: about a tenth of a small model's step, spent in the kernel.
Raising the mmap and trim thresholds keeps that memory in the process for reuse (the resident
size stays at its peak, as with CUDA's caching allocator). Elsewhere than glibc, nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit: larger blocks still use mmap
TRIM_THRESHOLD = 1 << 30


def _libc_function(name: str):
    """glibc's ``name`` (mallopt, malloc_trim), or None elsewhere (macOS, musl without it)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def give_back_freed_memory() -> None:
    """Return what malloc keeps after frees to the kernel now (glibc's malloc_trim), e.g. before measuring how
    much memory a piece of work needs (auralm.planning.autobatch: a probe reusing kept memory would show no growth)."""
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed blocks; whether it was done."""
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
