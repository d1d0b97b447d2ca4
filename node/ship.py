"""The one way the controller sends a node program: ``program(name)`` -> the source of a bootstrap for the node's
Python (``python -c SOURCE ARGS``, or ``python - ARGS`` with it on stdin).

The bootstrap carries this package's modules as source (compressed: the whole package stays far below the 128 KiB a
command line's argument may hold), puts a finder for them first in ``sys.meta_path``, so that ``import node`` and
``import node.cgroups`` there read what this machine sent (nothing of the project need be installed on the node, and
a checkout there of another commit is not read), then runs the one dispatch: ``node.main([name, *ARGS])`` ->
``node.<name>.main(ARGS)``, and ends with ``node.end`` (output flushed, no interpreter teardown). Its first line names
the program (``# hrmctl-node sampler``): a node's process list shows what runs.

This module runs on the controller only and is not sent.
"""

from __future__ import annotations

import base64
import functools
import json
import zlib
from pathlib import Path

import node

HERE = Path(__file__).resolve().parent
NOT_SENT = ("ship", "__main__", "torchrun")  # the controller's side; `python -m node` and torchrun: from a checkout

BOOTSTRAP = r'''# hrmctl-node %(name)s: the node package, sent as source (node/ship.py)
import base64, importlib.util, json, sys, zlib


class _Sent:
    sources = json.loads(zlib.decompress(base64.b64decode("%(blob)s")))

    def find_spec(self, name, path=None, target=None):
        if name in self.sources:
            return importlib.util.spec_from_loader(name, self, is_package=name == "node")

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        where = "node/__init__.py" if name == "node" else name.replace(".", "/") + ".py"
        exec(compile(self.sources[name], where, "exec"), module.__dict__)


sys.meta_path.insert(0, _Sent())
import node
node.end(node.main([%(name)r] + sys.argv[1:]))
'''


def sources() -> dict[str, str]:
    """The package's modules as the node gets them: module name -> source."""
    return {"node" if p.stem == "__init__" else f"node.{p.stem}": p.read_text(encoding="utf-8")
            for p in sorted(HERE.glob("*.py")) if p.stem not in NOT_SENT}


@functools.lru_cache(maxsize=None)
def _blob() -> str:
    return base64.b64encode(zlib.compress(json.dumps(sources()).encode(), 9)).decode("ascii")


def program(name: str) -> str:
    """The bootstrap that runs node program `name` (one of node.PROGRAMS) on a node's Python."""
    sent = [p for p in node.PROGRAMS if p not in NOT_SENT]
    if name not in sent:
        raise ValueError(f"no node program {name!r} to send (there are {', '.join(sent)})")
    return BOOTSTRAP % {"name": name, "blob": _blob()}
