"""What keeps torch's compiler (torch._dynamo) out of a process that compiles nothing, as no rank of this project's
does: torch 2.13 imports it on first use of an optimizer (its marks around ``step`` and the methods it keeps from the
compiler's tracing) and in DistributedDataParallel's constructor, 1.1-1.2 s of CPU at the start of every rank.

- ``resolved_to_itself``: a method torch wraps in ``torch._disable_dynamo``, made to run as it is.
- ``ddp_mode_read``: DistributedDataParallel's constructor reads the compiler's DDP mode without importing it.

Imports torch only.
"""

from __future__ import annotations

import contextlib
import sys
import types

import torch
import torch._compile as _compile


def resolved_to_itself(method) -> None:
    """torch wraps ``method`` in ``torch._disable_dynamo`` (keep the compiler from tracing it), whose first call
    imports torch._dynamo to make the disabled function and caches it on the function it wraps. Outside a compiled
    graph that function runs as it is, so the cache is filled with the function itself, before any call; a method of
    another torch, without that wrapper, is left alone. It holds for every use of the method in a process that
    imports this: none of this project's compiles (a process that did would trace these methods instead of skipping
    them)."""
    fn, code = getattr(method, "__wrapped__", None), getattr(method, "__code__", None)
    if fn is not None and code is not None and (code.co_filename, code.co_name) == (_compile.__file__, "inner"):
        setattr(fn, "__dynamo_disable", fn)


@contextlib.contextmanager
def ddp_mode_read():
    """DistributedDataParallel's constructor asks ``torch._dynamo.utils.get_optimize_ddp_mode()`` whether the
    compiler's Python reducer is on, and that attribute imports the compiler. Where the compiler is not imported yet
    nothing has changed its config, so the answer is the config's default, ``"ddp_optimizer"`` (the C++ reducer):
    during the constructor ``torch._dynamo`` is a stand-in that gives that answer, removed after. Where the compiler
    is imported already, the real one answers."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    stand_in = types.SimpleNamespace(utils=types.SimpleNamespace(get_optimize_ddp_mode=lambda: "ddp_optimizer"))
    torch._dynamo = stand_in
    try:
        yield
    finally:
        if torch.__dict__.get("_dynamo") is stand_in:
            del torch._dynamo
