"""The node programs' one protocol: lines of text on stdin and stdout, each ONE JSON object (compact, UTF-8).

A request is ``{"op": NAME, ...}``; its answer is one object. Besides answers, a program says, each on a line:
  {"ready": PROGRAM}   it is up and reads requests (the peer agent, before its first request)
  {"alive": true}      still at work on a long request (the sync receiver, every HEARTBEAT_S): a silence is a lost link
  {"step": NAME}       where a long request is (setup's install)
A one-shot program (the probe, setup's facts and finish) prints its answer as its last line; the sampler prints one
object per interval. The one exception to the framing: a sync ``put`` request's file bytes follow its line on stdin,
counted in the request (binary, never framed). The controller's clients read the same lines with decode() / last().
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
