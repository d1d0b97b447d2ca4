"""The error a user can act on: ``str(err)`` is the whole message, one line; and how a tool's process ends."""

from __future__ import annotations

import gc
import json
import os
import sys
from typing import NoReturn

# Under hrmctl (its launcher sets LAUNCHER_ENV on every node), a stop that a restart cannot fix (bad input, a run
# that cannot learn, out of memory: exit status 2) is also printed after STOP_TAG, as JSON {"reason": the line
# without its "error: ", "rank": n, "exit_code": 2}. The launcher (cli/launch/run/log.py) takes it as the run's reason
# and does not restart the run; the tag's line goes to the node's log file, not to the screen.
STOP_TAG = "auralm-stop: "
LAUNCHER_ENV = "HRMCTL_JOB"
BAD_INPUT_EXIT = 2


class UserError(Exception):
    """Bad input (config, data, checkpoint): printed as ``error: ...``, exit status 2."""


def stop(line: str, rank: int) -> int:
    """Print the stop's one line (``error: ...``) on stderr, and its tagged twin under hrmctl; BAD_INPUT_EXIT."""
    print(line, file=sys.stderr, flush=True)
    if os.environ.get(LAUNCHER_ENV):
        reason = line[len("error: "):] if line.startswith("error: ") else line
        doc = {"reason": reason, "rank": rank, "exit_code": BAD_INPUT_EXIT}
        print(STOP_TAG + json.dumps(doc), file=sys.stderr, flush=True)
    return BAD_INPUT_EXIT


def exit_frozen(code: int) -> NoReturn:
    """End a tool's process (``python -m auralm.planning.sizing`` ...) with ``code``, what it made frozen first
    (gc.freeze): the interpreter's collector passes at exit then skip it. With torch imported, most of the process's
    objects, that is about 0.4 s of CPU less (`python -c "import torch"`: 1.5-1.6 s, 1.1-1.3 s with the freeze,
    2026-11-28). A rank leaves with os._exit (training.distributed.exit_process) and needs none."""
    gc.freeze()
    sys.exit(code)
