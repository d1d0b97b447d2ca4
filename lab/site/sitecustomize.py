"""Run as every Python process of the suite starts (tests/conftest.py puts this folder on PYTHONPATH): in a torchrun
agent, lab/forked_ranks.py forks the ranks; in any other process, nothing. The test on the command line is a cheap
gate (forked_ranks.GATE, spelled here so that no other process loads anything: 6 ms a process, thousands of them);
``activate`` decides. Loaded by its path, so that the checkout need not be importable here."""

import sys

if any(a in ("torchrun", "torch.distributed.run") for a in getattr(sys, "orig_argv", [])[:4]):
    import importlib.util
    import os

    _spec = importlib.util.spec_from_file_location(
        "hrmlab_forked_ranks", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                            "forked_ranks.py"))
    _module = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    _module.activate()
