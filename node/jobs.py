"""A run's processes on a node, found by their tag (HRMCTL_JOB in their environment) with what they started:
``jobs states JOB`` -> ``{"states": {status: count}}``; ``jobs stop JOB GRACE [SETTLE]`` -> ``{"found": N, "left": M}``;
``jobs ranks JOB`` -> ``{"signalled": N}``. One JSON line each (node.lines). psutil is the node's own (the Python
that runs torchrun has it), imported when a command runs.

- states: what the lost-node check saw of the job (running, stopped by SIGSTOP as on a sleeping machine, gone);
  client: cli/launch/run/lost.py;
- stop: ``SETTLE`` seconds (default 0) for the processes to end by themselves (they have just been hung up: a second
  signal in the middle of torchrun's own stop makes it print tracebacks), then SIGTERM, then SIGKILL after ``GRACE``
  seconds to what is left and to what the job started meanwhile; client: cli/launch/run/attempt.py;
- ranks: SIGUSR1 to every rank of the job (the children of its torchrun agent: save a checkpoint, then stop);
  client: cli/launch/run/save_stop.py.
"""

import os
import signal

from node.lines import say

AGENTS = ("torch.distributed.run", "-m node torchrun")  # a torchrun agent's command line holds one of these


def tagged(job: str, attrs=("environ",)) -> dict:
    """pid -> process of every process tagged ``job`` (another user's: its environment unreadable, skipped) and of
    everything they started, this one aside."""
    import psutil

    me, found = os.getpid(), {}
    for p in psutil.process_iter(list(attrs), ad_value=None):
        if p.pid != me and (p.info["environ"] or {}).get("HRMCTL_JOB") == job:
            found[p.pid] = p
            try:
                found.update((c.pid, c) for c in p.children(recursive=True) if c.pid != me)
            except psutil.Error:
                pass
    return found


def running(procs) -> list:
    import psutil

    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.Error:
            pass
    return alive


def _signal(procs, kill: bool) -> None:
    import psutil

    for p in procs:
        try:
            p.kill() if kill else p.terminate()
        except psutil.Error:
            pass


def states(job: str) -> dict:
    import psutil

    counts = {}
    for p in tagged(job).values():
        try:
            counts[p.status()] = counts.get(p.status(), 0) + 1
        except psutil.Error:
            pass
    return {"states": counts}


def stop(job: str, grace: float, settle: float = 0.0) -> dict:
    import psutil

    first = tagged(job)
    _, alive = psutil.wait_procs(list(first.values()), timeout=settle) if settle else ([], list(first.values()))
    alive = running(alive) + [p for pid, p in tagged(job).items() if pid not in first]
    _signal(alive, kill=False)
    _, alive = psutil.wait_procs(alive, timeout=grace)
    late = {p.pid: p for p in running(alive)}  # what is still there, and what the job started meanwhile: SIGKILL
    late.update((pid, p) for pid, p in tagged(job).items() if pid not in first)
    _signal(late.values(), kill=True)
    _, alive = psutil.wait_procs(list(late.values()), timeout=2.0)
    left = running(alive) + running([p for pid, p in tagged(job).items() if pid not in late])
    return {"found": len(first), "left": len(left)}


def ranks(job: str) -> dict:
    """SIGUSR1 to the children of the job's torchrun agents."""
    import psutil

    n = 0
    for p in psutil.process_iter(["environ", "cmdline"], ad_value=None):
        line = " ".join(p.info["cmdline"] or ())
        if (p.info["environ"] or {}).get("HRMCTL_JOB") != job or not any(a in line for a in AGENTS):
            continue
        try:
            children = p.children()
        except psutil.Error:
            continue
        for rank in children:
            try:
                rank.send_signal(signal.SIGUSR1)
                n += 1
            except psutil.Error:
                pass
    return {"signalled": n}


def main(argv: list) -> int:
    command, job, rest = argv[0], argv[1], argv[2:]
    if command == "states":
        say(states(job))
    elif command == "stop":
        say(stop(job, float(rest[0]), float(rest[1]) if len(rest) > 1 else 0.0))
    elif command == "ranks":
        say(ranks(job))
    else:
        return 2
    return 0
