"""The launcher's plan process: one on the master for a whole launch (cli/launch/plan/planner.py), so that torch is
imported and the run's model built once for every question the launch asks of the trainer's plan, rather than once
a question in a process of its own. ``python -m auralm.planning.server`` reads one JSON request a line on stdin and
answers each, in order, with one JSON line; it ends at the end of its input.

  {"ask": "size", "args": [...], "world": N, "vocab": V or null}   sizing.document: parameters, memory per rank
  {"ask": "time", "args": [...], "world": N}                       timing.estimate: the dry run's time
  {"ask": "link", "args": [...], "world": N or null, "link": {...}}  link_budget.advice: train's warning, the wire

An answer is {"ok": document} or {"error": "one line"}: a question the trainer's parser refuses, or one that fails,
is answered so, and the process goes on with the next.
"""

from __future__ import annotations

import json
import sys

import torch  # noqa: F401  (at once: the import, a second or more, overlaps the launcher's handshakes with the nodes)

from auralm.errors import UserError, exit_frozen
from auralm.planning import link_budget, sizing, timing

QUESTIONS = {
    "size": lambda q: sizing.document(q["args"], q.get("world") or 1, q.get("vocab")),
    "time": lambda q: timing.estimate(q["args"], q.get("world") or 1),
    "link": lambda q: link_budget.advice(q["args"], q["link"], q.get("world")),
}


def answer(question: dict) -> dict:
    try:
        return {"ok": QUESTIONS[question["ask"]](question)}
    except UserError as e:
        return {"error": str(e)}
    except Exception as e:  # noqa: BLE001  one line, as the trainer's tools end: the launcher says it and goes on
        return {"error": f"{type(e).__name__}: {e}"}


def main() -> int:
    answers, sys.stdout = sys.stdout, sys.stderr  # what a question prints on the way goes to stderr, not among answers
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(answer(json.loads(line))), file=answers, flush=True)
    return 0


if __name__ == "__main__":
    exit_frozen(main())
