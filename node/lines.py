"""The node programs' one protocol: text lines on stdin and stdout, every answer ONE JSON object on a line of its own.

Besides JSON objects, three fixed words travel on the same lines: ``ready`` (the peer agent is up), ``.`` (the sync
receiver still at work: a heartbeat, so that a silence means a lost link) and ``step NAME`` (setup's install, where it
is). The peer agent's clock request is the one letter ``t`` (answered with a JSON number: Cristian's method wants the
shortest round trip). A sync ``put`` job's file bytes follow its line on stdin, counted in the job: binary, never
framed. The controller's clients read the same lines with decode().
"""

from __future__ import annotations

import json
import sys
import threading

_WRITING = threading.Lock()  # whole lines even when threads write at once (the receiver's worker and heartbeat)


def encode(doc) -> str:
    return json.dumps(doc, separators=(",", ":"))


def write(text: str, stream=None) -> None:
    """One line, flushed at once (the other side waits for it)."""
    out = stream or sys.stdout
    with _WRITING:
        out.write(text + "\n")
        out.flush()


def say(doc, stream=None) -> None:
    """One JSON line."""
    write(encode(doc), stream)


def decode(line):
    """A line's JSON object, or None when the line is not one (a heartbeat, a fixed word, a login banner)."""
    try:
        doc = json.loads(line)
    except (TypeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def last(text: str):
    """The last JSON object among the lines of a program's whole output, or None."""
    for line in reversed(text.strip().splitlines()):
        doc = decode(line) if line.startswith("{") else None
        if doc is not None:
            return doc
    return None


def requests(stream=None):
    """The request lines on stdin, stripped, until it closes."""
    for raw in stream or sys.stdin:
        yield raw.strip()
