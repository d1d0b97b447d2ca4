"""Less fixed cost per `hrmctl` process (measured with `python -X importtime`).

defer_module("invoke")  paramiko.config imports invoke (about 60 ms with its yaml, asyncio and
                        unittest.mock) only to run `Match exec` lines of ~/.ssh/config: a stand-in
                        module loads the real one on the first attribute used.
quick_exit(code)        flush stdout/stderr and end the process without tearing down every
                        imported module (about 90 ms with pydantic, rich and paramiko loaded);
                        for commands that have nothing left to clean up.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types


class _Deferred(types.ModuleType):
    """In sys.modules until an attribute is used; then the real module replaces it."""

    def __getattr__(self, attr: str):
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        real = importlib.import_module(self.__name__)
        self.__dict__.update({k: v for k, v in real.__dict__.items() if not k.startswith("__")})
        return getattr(real, attr)


def defer_module(name: str) -> None:
    """Make `import name` cheap until the module is really used (nothing if absent or loaded)."""
    if name in sys.modules or importlib.util.find_spec(name) is None:
        return
    sys.modules[name] = _Deferred(name)


def quick_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
