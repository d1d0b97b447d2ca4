"""Put on PYTHONPATH (with USE_LIBUV=0) by hrmctl for a node whose torch has no libuv TCPStore.

torch 2.13's static rendezvous and the workers' agent-store client create `TCPStore(...)`
without `use_libuv`, and TCPStore does not read USE_LIBUV, so the variable alone cannot turn
libuv off there. When torch.distributed is imported, this makes `use_libuv=False` the default of
every TCPStore (an explicit use_libuv still wins). Standard library only; does nothing unless
USE_LIBUV=0.
"""

import importlib.abc
import importlib.util
import os
import sys


def _patch(dist):
    base = dist.TCPStore

    class TCPStore(base):
        def __init__(self, *args, **kwargs):
            if len(args) < 9:
                kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    TCPStore.__name__ = TCPStore.__qualname__ = "TCPStore"
    for name, mod in list(sys.modules.items()):
        if (name == "torch.distributed" or name.startswith("torch.distributed.")) and \
                getattr(mod, "TCPStore", None) is base:
            mod.TCPStore = TCPStore


class _AfterTorchDistributed(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            if hasattr(module, "TCPStore"):
                _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("USE_LIBUV") == "0":
    sys.meta_path.insert(0, _AfterTorchDistributed())
