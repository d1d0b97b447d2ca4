"""The `hrmctl top` command: select the nodes, open a channel to each, then a live view, one snapshot or JSON.

Keys: when stdin is a terminal it is put in cbreak mode (single keys, no echo; Ctrl-C still
interrupts) and restored on the way out, however the view ends; `q` leaves.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Iterator

from rich.console import Console

from cli.errors import HrmctlError
from cli.nodes.inventory import load_inventory
from cli.nodes.remote import CONNECT_TIMEOUT

from .view import render, snapshot_json
from .watch import Watch

ONCE_GRACE_S = 20.0  # --once: after connecting, how long a node may take to send its first line


class Keys:
    """Single key presses from stdin when it is a terminal; otherwise nothing is read."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stdin
        self.fd = None
        self.saved = None

    def __enter__(self) -> "Keys":
        try:
            fd = self.stream.fileno()
        except (AttributeError, ValueError, OSError):
            return self
        if not os.isatty(fd):
            return self
        import termios
        import tty

        self.saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None and self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def read(self, timeout: float) -> str | None:
        """The next key pressed within timeout seconds, or None (after sleeping timeout when there are no keys)."""
        if timeout <= 0:
            return None
        if self.fd is None:
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return None
        data = os.read(self.fd, 32)
        if not data:  # the terminal went away
            raise EOFError
        return data.decode("utf-8", "replace")


def top(inventory: str | None, nodes: str | None, *, interval: float, once: bool, as_json: bool,
        accept_new_host_keys: bool, console: Console) -> int:
    if not interval > 0:
        raise HrmctlError(f"--interval {interval:g} must be a positive number of seconds, e.g. --interval 1")
    from cli.slurm.allocation import nodes_or_allocation

    selected = nodes_or_allocation(nodes, lambda: load_inventory(inventory).select(nodes))  # an allocation's: srun
    watch = Watch(selected, interval=interval, accept_new_host_keys=accept_new_host_keys)
    with watch:
        if once:
            watch.wait_all(CONNECT_TIMEOUT + ONCE_GRACE_S)
            states = watch.snapshot()
            if as_json:
                console.file.write(json.dumps(snapshot_json(states), default=str) + "\n")
                console.file.flush()
            else:
                console.print(render(states, interval=interval, live=False))
            answered = sum(1 for s in states if s.data is not None and s.error is None)
            return 0 if answered == len(states) else (3 if answered == 0 else 1)
        if as_json:
            return _json_lines(watch, interval, console)
        return _live(watch, interval, console)


def _json_lines(watch: Watch, interval: float, console: Console) -> int:
    """--json without --once: one snapshot per interval, a JSON document a line, until Ctrl-C."""
    watch.wait_all(CONNECT_TIMEOUT + ONCE_GRACE_S)
    try:
        while True:
            console.file.write(json.dumps(snapshot_json(watch.snapshot()), default=str) + "\n")
            console.file.flush()
            time.sleep(interval)
    except (KeyboardInterrupt, BrokenPipeError):
        return 0


def _live(watch: Watch, interval: float, console: Console) -> int:
    from rich.live import Live

    live_console = getattr(console, "console", console)  # cli.app's LazyConsole: the Console itself
    # Ctrl-C sets a flag instead of raising KeyboardInterrupt wherever the main thread happens to be: raised
    # between a lock's acquire and its `with` block (snapshot), it left the lock held and close() waiting forever
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        with contextlib.ExitStack() as stack:
            keys = stack.enter_context(Keys())
            live = stack.enter_context(Live(render(watch.snapshot(), interval=interval), console=live_console,
                                            auto_refresh=False, transient=False, redirect_stdout=False,
                                            redirect_stderr=False))
            try:
                for _ in _ticks(interval, keys, stop):
                    live.update(render(watch.snapshot(), interval=interval), refresh=True)
            except EOFError:
                pass
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0


def _ticks(interval: float, keys: Keys, stop: threading.Event) -> Iterator[None]:
    """Yield every interval (and at once after the first answers) until `q` is pressed or `stop` is set."""
    next_at = time.monotonic() + min(interval, 0.7)
    while not stop.is_set():
        key = keys.read(max(0.0, next_at - time.monotonic()))
        if key is not None and "q" in key.lower():
            return
        if time.monotonic() >= next_at:
            next_at = max(next_at + interval, time.monotonic() + 0.05)
            yield None
