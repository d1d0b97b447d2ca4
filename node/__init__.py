"""What runs on a node before or beside training, standard library only at import (DESIGN.md's ``node/``): one
package, sent to a node's Python as source by one function (ship.program), one dispatch (main), one protocol (lines).

    probe.py          what one node can do: prints one JSON object (OS/WSL kind, Python, torch/CUDA/NCCL/gloo, the
                      route to a peer, resources, disk, the project's commit); client: netcheck/node_probe_client.py
    peer.py           the peer checks: a line server on stdin/stdout (clock samples, temporary listeners, parallel
                      connects); client: netcheck/peer_agent_client.py
    setup.py          `hrmctl setup`'s node side: facts, install (a venv beside the old one), finish; cli/setup/run.py
    sync_receiver.py  `hrmctl sync-data`'s node side: scan, mkdirs, put, finalize, space; cli/sync/send.py
    sampler.py        `hrmctl top`'s node side: one JSON line per interval; cli/top/watch.py
    free_port.py      a port the master can listen on for torchrun's store; cli/launch/preflight/prepare.py
    dirs.py           the trainer's data and run directories on a node before a launch: there, readable or writable,
                      with room, the data prepared for the task; psutil present; cli/launch/preflight/storage.py
    jobs.py           a run's processes on the node, by their tag: their states (cli/launch/run/lost.py), their stop
                      (cli/launch/run/attempt.py), SIGUSR1 to its ranks (cli/launch/run/save_stop.py)
    torchrun.py       torchrun on a node, in place of `python -m torch.distributed.run` (a first launch's guess checked,
                      a shorter exit barrier, a cheaper end; torch imported in its main): run from the node's checkout
                      (`python -m node torchrun ...`, the plan's argv: cli/launch/plan/plan.py), not sent
    cgroups.py        what a process may use of its machine (CPUs, memory, the OOM killer's count): read by the probe
                      and by the trainer's batch_size=auto on the node
    lines.py          the protocol: text lines, every answer one JSON object; the clients decode with it too
    ship.py           (the controller's, not sent) program(name): the bootstrap that carries this package to a node

On a node: ``python -c "$(program NAME)" ARGS`` (or the bootstrap on stdin: ``python - ARGS``) -> main([NAME, *ARGS])
-> ``node.NAME.main(ARGS)``, and the process ends at once (end()); nothing of the project need be installed on the
node. From a checkout, ``python -m node NAME ARGS`` is the same dispatch with the interpreter's ordinary end (torchrun's
handlers run). The trainer (auralm) may import this package; it imports neither ``cli`` nor ``netcheck``.
"""

import os
import sys

PROGRAMS = ("probe", "peer", "setup", "sync_receiver", "sampler", "free_port", "dirs", "jobs", "torchrun")


def main(argv: list) -> int:
    """The one dispatch: ``[PROGRAM, *ARGS]`` -> ``node.PROGRAM.main(ARGS)``, its exit code."""
    if not argv or argv[0] not in PROGRAMS:
        sys.stderr.write("usage: python -m node {%s} ARGS...\n" % ",".join(PROGRAMS))
        return 2
    import importlib

    return importlib.import_module("node." + argv[0]).main(argv[1:]) or 0


def end(code: int) -> None:
    """The program's output flushed, then the process ends without the interpreter's teardown (a probe's torch:
    about 1 s on a small machine; a sampler's stdin thread may hold stdin's lock, which a teardown would abort on)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
