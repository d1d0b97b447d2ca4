"""A rank for tests/unit/test_forked_ranks.py, run by torchrun as ``-m tests.rank_probe DIR END``: it writes what it
was started with to DIR/<RANK>.json, registers an exit handler (DIR/<RANK>.atexit), says hello on stdout without a
flush, then ends as END says: ok, exit3 (sys.exit(3)), message (sys.exit with a text), raise (an exception), or
interrupt (SIGINT to itself)."""

import sys

FORKED = "torch" in sys.modules  # a new interpreter has imported nothing of torch's at this line

import atexit  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def main() -> None:
    out, end = Path(sys.argv[1]), sys.argv[2]
    import torch

    rank = os.environ.get("RANK")
    files = []
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd") if int(n) > 2):
        try:
            files.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own descriptor, closed since
            pass
    import logging

    streams = [h.stream for lg in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
               for h in getattr(lg, "handlers", ()) if isinstance(h, logging.StreamHandler) and h.stream is not None]
    with open("/proc/self/cmdline", "rb") as fh:
        cmdline = [part.decode() for part in fh.read().split(b"\0")]
    while cmdline and not cmdline[-1]:  # a command line rewritten in place is padded with empty arguments
        cmdline.pop()
    report = {"forked": FORKED, "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "argv": sys.argv,
              "cmdline": cmdline, "rank": rank, "local_rank": os.environ.get("LOCAL_RANK"),
              "world": os.environ.get("WORLD_SIZE"), "omp": os.environ.get("OMP_NUM_THREADS"),
              "threads": torch.get_num_threads(), "files": files,
              "log_streams": len(streams), "log_streams_ours": all(st in (sys.stdout, sys.stderr) for st in streams),
              "main": __name__, "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
              "sigpipe_ignored": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN}
    (out / f"{rank}.json").write_text(json.dumps(report))
    atexit.register(lambda: (out / f"{rank}.atexit").write_text("ran"))
    sys.stdout.write(f"rank {rank} says hello\n")  # -u: in the log at once, flushed or not
    time.sleep(0.5)
    if end == "exit3":
        sys.exit(3)
    if end == "message":
        sys.exit("rank gave up: a message")
    if end == "raise":
        raise RuntimeError("the rank's own error")
    if end == "interrupt":
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)


if __name__ == "__main__":
    main()
