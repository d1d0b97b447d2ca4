"""Runs on a node in place of `python -m torch.distributed.run`: torchrun's own main, in this process.

Every launch on a node whose project has this module starts torchrun through it, for what it adds: the check of a
first launch's guess (below), a shorter exit barrier, and a cheaper end; torchrun starts the ranks its own way.
torch's objects are left out of the collector's passes once torchrun has imported them (gc.freeze), so the agent's exit skips them:
about 0.4 s of CPU an agent, which plain torchrun spends at every launch on every node (`python -c "import torch"`:
1.58 CPU-s, 1.22 with the freeze; 2026-11-29). A node with an older copy of hrmctl's project gets plain torchrun.

The launcher needs three answers from a node's torch: how many CUDA devices it sees, whether it has
NCCL, and whether its TCPStore starts with libuv. Asking costs an `import torch` (seconds on a
small machine), and torchrun imports torch right after anyway. So on a node whose answers are
not cached yet, the launcher plans with a guess made without torch (the driver's GPU count, NCCL
with the GPUs, libuv on) and starts this module with that guess; it imports torch once, prints
what the node really has on one tagged line (the launcher caches it), and then either runs
torchrun in this same process (the guess was right: nothing was paid twice) or exits with
FACTS_DIFFER before anything else starts, and the launcher plans again from the real answers.

    python -m node torchrun --expect '{"gpus": 0, "nccl": false, "libuv_ok": true}' -- <torchrun args>

With ``--held stdin`` (a Slurm allocation's nodes: cli/launch/preflight/prestart.py), it is started before the launch is
planned: it imports torchrun while the launcher's preflight runs, then reads torchrun's arguments and the node's
environment as one JSON line on its standard input ({"argv": [...], "env": {...}}, and "own": this module's other
options, such as --expect, when the plan gave some), or ends at once if the input ends first (the preflight
failed: nothing started).

With ``--exit-barrier S`` (a run that nodes may leave without the others restarting: DiLoCo under
training.elastic) torchrun's agent waits at most S seconds at its end for the other nodes' agents (torchrun waits
300 and has no option for it): a node that left the run never arrives. ``--expect`` is then optional.

Standard library at import, torch inside main (the node has the project in its workdir, not hrmctl's dependencies);
started from the node's checkout through node's one dispatch (``python -m node torchrun``), never sent by node.ship.
"""

from __future__ import annotations

import gc
import json
import os
import sys

FACTS_TAG = "hrmctl-node-facts: "
FACTS_DIFFER = 75  # EX_TEMPFAIL: plan again with the facts printed, then launch again
LEFT_OUT_EXIT = 75  # a rank counted out of a run while it was away ends with it (auralm/training/members.py)
PLANNED = ("gpus", "nccl", "libuv_ok")  # what the plan depends on


def found_facts() -> dict:
    """This node's answers, from one import of torch (the one torchrun then uses)."""
    from importlib import metadata

    from node.probe import torch_facts

    tf = torch_facts()
    try:
        version = metadata.version("torch")  # the launcher's cache key names torch by its distribution
    except metadata.PackageNotFoundError:
        version = tf["version"]
    return {"torch": version, "gpus": tf["cuda_devices"], "nccl": tf["nccl"],
            "libuv_ok": tf["libuv_ok"] is not False, "error": tf["error"]}


def options(argv: list[str]) -> tuple[dict, list[str]] | None:
    """({"--expect": JSON text, "--exit-barrier": seconds text}, torchrun's args), or None when malformed."""
    if "--" not in argv:
        return None
    own, rest = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    if len(own) % 2 or any(k not in ("--expect", "--exit-barrier", "--held") for k in own[::2]):
        return None
    return dict(zip(own[::2], own[1::2])), rest


def shorter_exit_barrier(seconds: float) -> None:
    """torchrun's agent waits ``seconds`` for the other agents at its end, and says so in one line if one never
    came (its own message has a traceback)."""
    import logging

    from torch.distributed.elastic.agent.server import api, local_elastic_agent

    init = local_elastic_agent.LocalElasticAgent.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **dict(kwargs, exit_barrier_timeout=seconds))

    local_elastic_agent.LocalElasticAgent.__init__ = patched

    class OneLine(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if str(record.msg).startswith("Error waiting on exit barrier"):
                record.msg, record.args, record.exc_info = (
                    "hrmctl: not every node's torchrun came to the end within %ss (a node that left the run, or one "
                    "still finishing): ending", (f"{seconds:g}",), None)
            return True

    logging.getLogger(api.__name__).addFilter(OneLine())


def held_arguments() -> tuple[dict, list[str]] | None:
    """torchrun imported (the seconds the launcher's preflight runs meanwhile), then this module's options and
    torchrun's arguments from the launcher, its environment applied (its workers inherit it); None when the launcher
    ended the input instead."""
    import importlib

    importlib.import_module("torch.distributed.run")  # what torchrun's start costs, paid while the launcher checks

    line = sys.stdin.readline()
    if not line.strip():
        return None
    given = json.loads(line)
    os.environ.update(given["env"])
    return dict(given.get("own") or {}), list(given["argv"])


def main(argv: list[str]) -> int:
    parsed = options(argv)
    if parsed is None:
        print("usage: python -m node torchrun [--expect JSON] [--exit-barrier S] [--held stdin] -- "
              "<torchrun args>", file=sys.stderr)
        return 2
    own, rest = parsed
    if "--held" in own:
        given = held_arguments()
        if given is None:
            return 0
        own, rest = given
    if "--expect" in own:
        expect = json.loads(own["--expect"])
        found = found_facts()
        print(FACTS_TAG + json.dumps(found), flush=True)
        if found["error"]:
            print(f"error: torch does not import here: {found['error']}", file=sys.stderr, flush=True)
            return 1
        differ = [f"{k} {expect.get(k)} -> {found[k]}" for k in PLANNED if expect.get(k) != found[k]]
        if differ:
            print(f"this node's torch differs from the launch plan's guess ({', '.join(differ)}); "
                  "hrmctl plans again with what it found", flush=True)
            return FACTS_DIFFER
    if "--exit-barrier" in own:
        shorter_exit_barrier(float(own["--exit-barrier"]))
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    gc.freeze()  # torch's objects left out of the collector's passes (auralm/errors.py exit_frozen: 0.4 s of CPU)
    try:
        torchrun(rest)
    except SignalException as exc:  # stopped by a signal (the launcher's stop): torchrun stopped its workers
        print(f"torchrun stopped by {exc.sigval.name}", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        if {f.exitcode for f in exc.failures.values()} != {LEFT_OUT_EXIT}:
            raise  # torchrun's report: the launcher reads the rank that failed first from it
        # the ranks here were counted out of a run that went on without this node (asleep, cut off): they said so
        # in their own line; this is not a failure to report with a traceback
        print(f"torchrun ends: its rank(s) {', '.join(map(str, sorted(exc.failures)))} were counted out of the run "
              f"(exit {LEFT_OUT_EXIT}); hrmctl starts this node again when it answers", file=sys.stderr, flush=True)
        return 1  # what the exception's exit was: the launcher's reading of this node's end stays as it was
    return 0
