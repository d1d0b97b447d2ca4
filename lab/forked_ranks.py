"""The suite's start-up, got in the suite: torchrun's ranks forked from its agent on the lab's nodes and this machine.

torchrun starts each rank as a new interpreter (``python -u -m auralm.training.train ...``) that imports torch again:
about 1.3 s of CPU a rank on a small machine (`python -c "import torch"`, 2026-11-29), paid at every launch and every
restart. On a user's run that is nothing beside its minutes of training, and hrmctl's product lets torchrun start its
ranks its own way. The suite starts a few hundred ranks on two cores, so here, in the suite's processes only, the agent
(``python -m node torchrun`` or ``python -m torch.distributed.run``), which has torch imported, forks each
rank instead, and the rank runs its module there as ``python -u -m`` would. How it gets there: ``activate()``, run as
an interpreter starts (lab/site/sitecustomize.py on the PYTHONPATH of the suite's processes, tests/conftest.py; a
.pth file in the lab nodes' venv, lab/nodes.py), does nothing in any other process; in an agent it makes torchrun's
SubprocessHandler fork a ``python -u -m MODULE`` rank (a private method of torch's: this patch is the suite's, never
the product's). CUDA is never forked (it cannot be used in a child forked after it
started), so a GPU's ranks start as torchrun starts them. ``HRMCTL_FORK_RANKS=0`` in the agent's environment turns it
off.

What the rank sees is what a new interpreter would give it: its own session (torchrun signals the group),
the environment torchrun made for it (os.environ; torch's threads set from its OMP_NUM_THREADS), its output files
unbuffered as ``-u`` makes them, the signal handlers a new interpreter starts with, no exit handlers of the agent's, none of the agent's
open files (each replaced by /dev/null, so an object of the agent's that closes its descriptor later closes nothing
of the rank's), and its command line (``ps``, `hrmctl top`) rewritten to the rank's own. /proc/<pid>/environ still
shows the agent's environment: what reads a rank's rank finds it in its progress file (node/sampler.py), and a stop
finds ranks as the children of torchrun's agent (cli/launch/run/save_stop.py).

Standard library and torch only, and importable alone (the lab nodes' venv has a copy of it, not the checkout).
"""

from __future__ import annotations

import os
import sys
import time

OFF_ENV = "HRMCTL_FORK_RANKS"  # "0": ranks start as new interpreters (torchrun's own way)
AGENTS = (["node", "torchrun"], ["torch.distributed.run"])  # what follows ``python -m`` in a torchrun agent
GATE = ("torchrun", "torch.distributed.run")  # the cheap test: one of these among the first 4 arguments
RESET_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM")
IGNORED_SIGNALS = ("SIGPIPE", "SIGXFSZ")  # as Python's start-up leaves them: a closed pipe raises BrokenPipeError


class ForkedRank:
    """What torchrun's SubprocessHandler uses of its Popen (pid, poll, wait, send_signal, kill), for a forked rank."""

    def __init__(self, pid: int):
        self.pid, self.returncode, self.args = pid, None, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its end cannot be told, so not as a success
                self.returncode = 1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                import subprocess

                raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)


def can_fork() -> bool:
    """Whether ranks may be forked here: not turned off, and torch sees no CUDA device (a CPU build, or a CUDA build
    on a machine without a usable GPU; where it sees one, this process may have started CUDA by asking, and its
    ranks start as new interpreters)."""
    if os.environ.get(OFF_ENV) == "0" or not hasattr(os, "fork") or not os.path.isdir("/proc/self/fd"):
        return False  # turned off, or not Linux (the rank's files and command line are read from /proc)
    import torch

    try:
        return not torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a driver that cannot say: torchrun's own way
        return False


def activate() -> None:
    """In a torchrun agent (and not turned off): torchrun's SubprocessHandler forks its ranks. It imports torchrun's
    process handling (torch with it) here, as the interpreter starts, which the agent does next anyway. Anything else
    returns at once: every Python process of the suite imports this module and calls this as it starts, so the
    module imports only what the interpreter has loaded already; the rest is imported where a rank is forked."""
    argv = getattr(sys, "orig_argv", [])
    if os.environ.get(OFF_ENV) == "0" or "-m" not in argv[:3]:
        return
    at = argv.index("-m") + 1
    if not any(argv[at:at + len(a)] == a for a in AGENTS):
        return
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    install(subprocess_handler.SubprocessHandler)


def install(handler) -> None:
    """torchrun's SubprocessHandler forks a ``python -u -m MODULE`` rank from this process."""
    popen = handler._popen
    forkable: list[bool] = []  # can_fork(), asked at the first rank's start (torch is imported whole by then)

    def forking(self, args: tuple, env: dict):
        module = _module_of(args)
        if not forkable:
            forkable.append(can_fork())
        if module is None or not forkable[0]:
            return popen(self, args, env)
        return fork_rank(module, list(args[4:]), env, self._stdout, self._stderr)

    handler._popen = forking


def _module_of(args: tuple) -> str | None:
    """MODULE of torchrun's ``(python, -u, -m, MODULE, ...)``; None for anything else (a script, --no-python)."""
    if len(args) >= 4 and args[0] == sys.executable and args[1:3] == ("-u", "-m"):
        return args[3]
    return None


def fork_rank(module: str, argv: list[str], env: dict, stdout, stderr) -> ForkedRank:
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return ForkedRank(pid)
    code = 1
    try:  # the child: never returns into torchrun's agent
        _become_rank(module, argv, env, stdout, stderr)
        code = _run(module, argv)
        if code < 0:  # ended by a signal, as an interpreter ends on an uncaught KeyboardInterrupt
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
    except BaseException:  # noqa: BLE001 - nothing may go back up the agent's stack
        import traceback

        os.write(2, traceback.format_exc().encode(errors="replace"))
    os._exit(code if code >= 0 else 1)


def _become_rank(module: str, argv: list[str], env: dict, stdout, stderr) -> None:
    """What a new interpreter would have: see the module's docstring."""
    import atexit
    import io
    import signal

    os.setsid()
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for name in RESET_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    for name in IGNORED_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if stdout is not None:
        os.dup2(stdout.fileno(), 1)
    if stderr is not None:
        os.dup2(stderr.fileno(), 2)
    _forget_open_files()
    old_out, old_err = sys.stdout, sys.stderr
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=old_out.encoding)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=old_out.encoding,
                                                   errors=old_out.errors, write_through=True)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=old_err.encoding,
                                                   errors=old_err.errors, write_through=True)
    import logging

    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for h in getattr(logger, "handlers", ()):  # torchrun's own loggers: to the rank's streams, not the agent's
            if isinstance(h, logging.StreamHandler) and h.stream in (old_out, old_err):
                h.setStream(sys.stdout if h.stream is old_out else sys.stderr)
    atexit._clear()
    os.environ.clear()
    os.environ.update(env)
    if env.get("OMP_NUM_THREADS", "").isdigit() and int(env["OMP_NUM_THREADS"]) > 0:
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))  # read at torch's load, which was the agent's
    _rewrite_command_line([sys.executable, "-u", "-m", module, *argv])


def _forget_open_files() -> None:
    """/dev/null in place of every descriptor above 2: the agent's store socket, pipes and log files."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != null:
            try:
                os.dup2(null, fd)
            except OSError:  # the listing's own descriptor, closed since
                pass
    os.close(null)


def _rewrite_command_line(argv: list[str]) -> None:
    """The process's command line (/proc/self/cmdline: ps, `hrmctl top`) made ``argv``, written over the agent's in
    place (the rank's arguments are part of the agent's, so it fits unless the interpreter's path is much longer than
    the agent's first argument); left as it was where it does not fit or cannot be written."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49 of proc(5)
    except (OSError, ValueError, IndexError):
        return
    text = b"\0".join(a.encode(errors="surrogateescape") for a in argv) + b"\0"
    if len(text) > end - start:
        return
    ctypes.memmove(start, text.ljust(end - start, b"\0"), end - start)


def _run(module: str, argv: list[str]) -> int:
    """``module`` as ``python -m`` runs it; its exit code as the interpreter would give it."""
    import atexit
    import runpy
    import signal
    import threading
    import traceback

    code = 0
    try:
        sys.argv = [module, *argv]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit 1
        traceback.print_exc()
        code = 1
    threading._shutdown()  # the rank's own threads, as at the interpreter's end
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    return code
