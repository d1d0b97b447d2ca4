"""Fused CPU loops in C, built on first use with the machine's C compiler and loaded with ctypes.

``mhc(dtype)`` is the library of ``mhc.c`` (the mHC connections' loops) for streams of ``dtype`` (float32 or
bfloat16: the source built twice), or None where it cannot be built (no C compiler, as on a Windows machine
outside WSL; a build error; or ``AURALM_KERNELS=0``): the callers then run the same arithmetic on PyTorch's
own operations, slower. The build takes a second, is cached per machine under
``$AURALM_KERNEL_DIR`` (default ``~/.cache/auralm/kernels``) by a hash of the source and the flags, and is
written atomically, so ranks starting at once on one machine never load half a file.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
# -O2 with vectorisation rather than -O3: GCC 12's -O3 on an AVX-512 machine mixed two lanes of a masked select
# in the Sinkhorn backward (tests/unit/test_mhc_kernels.py caught it; -O2 gives the same speed here)
FLAGS = ["-O2", "-ftree-vectorize", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared", "-pthread"]
_loaded: dict[str, ctypes.CDLL | None] = {}
_failed: set[str] = set()  # the sources that could not be built or loaded in this process
_STREAMS = {torch.float32: [], torch.bfloat16: ["-DSTREAM_BF16"]}  # the stream types mhc.c is built for

_i64, _int, _float, _ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_void_p
_SIGNATURES = {
    "mhc_coefficients_forward": [_i64, _int, _int, _int, _int, _float] + [_ptr] * 10 + [_int],
    "mhc_coefficients_backward": [_i64, _int, _int, _int, _int, _float] + [_ptr] * 18 + [_int],
    "mhc_write_forward": [_i64, _int, _int, _ptr, _ptr, _ptr, _ptr, _ptr, _int],
    "mhc_write_backward": [_i64, _int, _int, _ptr, _ptr, _ptr, _int],
}


def cache_dir() -> Path:
    return Path(os.environ.get("AURALM_KERNEL_DIR") or Path.home() / ".cache" / "auralm" / "kernels")


def mhc(dtype: torch.dtype = torch.float32) -> ctypes.CDLL | None:
    """The mHC loops for streams of ``dtype``, built and loaded once per process; None where they cannot be
    (with one warning), or for a type they are not built for."""
    if dtype not in _STREAMS:
        return None
    key = _key(dtype)
    if key not in _loaded:
        # one warning for both types: a build that failed for one fails for the other for the same reason
        _loaded[key] = None if "mhc" in _failed else _load("mhc", _SIGNATURES, _STREAMS[dtype])
    return _loaded[key]


def _key(dtype: torch.dtype) -> str:
    return f"mhc-{str(dtype).removeprefix('torch.')}"


@contextlib.contextmanager
def off():
    """Within: every caller runs PyTorch's operations, as where the loops cannot be built (for tests and
    comparisons)."""
    saved = dict(_loaded)
    _loaded.update({_key(t): None for t in _STREAMS})
    try:
        yield
    finally:
        _loaded.clear()
        _loaded.update(saved)


def _load(name: str, signatures: dict[str, list], defines: list[str]) -> ctypes.CDLL | None:
    if os.environ.get("AURALM_KERNELS", "1") == "0":
        return None
    try:
        lib = ctypes.CDLL(str(_build(name, defines)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _failed.add(name)
        warnings.warn(f"auralm: the fused CPU loops ({name}.c) are not available, so PyTorch's slower operations "
                      f"run instead: {e}", RuntimeWarning, stacklevel=3)
        return None
    for fn, args in signatures.items():
        getattr(lib, fn).argtypes, getattr(lib, fn).restype = args, None
    return lib


def _build(name: str, defines: list[str] = ()) -> Path:
    """The shared library of ``name``.c with ``defines`` for this machine, compiled if it is not in the cache yet."""
    source = _HERE / f"{name}.c"
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None or shutil.which(cc) is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on the PATH; install one (Debian/Ubuntu: "
                           "apt install gcc) to train mHC models about twice as fast on a CPU")
    flags = [*FLAGS, *defines]
    key = hashlib.sha256(source.read_bytes() + " ".join([cc, *flags, platform.machine(), platform.node(),
                                                          sys.platform]).encode()).hexdigest()[:16]
    out = cache_dir() / f"{name}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{name}-", suffix=".so")
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source), "-o", tmp, "-lm"], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed on {source.name}: {done.stderr.strip().splitlines()[-1:]}")
        os.replace(tmp, out)  # atomic: another rank sees no library or a whole one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out
