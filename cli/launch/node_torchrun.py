"""Runs on a node in place of `python -m torch.distributed.run`, the first time hrmctl launches there.

The launcher needs three answers from a node's torch: how many CUDA devices it sees, whether it has
NCCL, and whether its TCPStore starts with libuv. Asking costs an `import torch` (seconds on a
small machine), and torchrun imports torch right after anyway. So on a node whose answers are
not cached yet, the launcher plans with a guess made without torch (the driver's GPU count, NCCL
with the GPUs, libuv on) and starts this module with that guess; it imports torch once, prints
what the node really has on one tagged line (the launcher caches it), and then either runs
torchrun in this same process (the guess was right: nothing was paid twice) or exits with
FACTS_DIFFER before anything else starts, and the launcher plans again from the real answers.

    python -m cli.launch.node_torchrun --expect '{"gpus": 0, "nccl": false, "libuv_ok": true}' -- <torchrun args>

Standard library and torch only (the node has the project in its workdir, not hrmctl's
dependencies).
"""

from __future__ import annotations

import json
import sys

FACTS_TAG = "hrmctl-node-facts: "
FACTS_DIFFER = 75  # EX_TEMPFAIL: plan again with the facts printed, then launch again
PLANNED = ("gpus", "nccl", "libuv_ok")  # what the plan depends on


def found_facts() -> dict:
    """This node's answers, from one import of torch (the one torchrun then uses)."""
    from importlib import metadata

    from netcheck.node_probe import torch_facts

    tf = torch_facts()
    try:
        version = metadata.version("torch")  # the launcher's cache key names torch by its distribution
    except metadata.PackageNotFoundError:
        version = tf["version"]
    return {"torch": version, "gpus": tf["cuda_devices"], "nccl": tf["nccl"],
            "libuv_ok": tf["libuv_ok"] is not False, "error": tf["error"]}


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--expect" or argv[2] != "--":
        print("usage: python -m cli.launch.node_torchrun --expect JSON -- <torchrun args>", file=sys.stderr)
        return 2
    expect = json.loads(argv[1])
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
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    try:
        torchrun(argv[3:])
    except SignalException as exc:  # stopped by a signal (the launcher's stop): torchrun stopped its workers
        print(f"torchrun stopped by {exc.sigval.name}", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
