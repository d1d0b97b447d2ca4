"""Talk to the peer checks' node agent (node/peer.py) over a Session-like object's `pipe(argv)`.

`start_agent(session)` starts it with the node's Python and waits for {"ready": ...}; the Agent's
requests are one JSON line each way. Closing the Agent closes the agent's stdin, so its
listeners disappear with it.
"""

from __future__ import annotations

import json
from typing import Any

from node.lines import decode
from node.ship import program


class AgentError(Exception):
    """The agent did not start or did not answer. str() is one line naming the node."""


class Agent:
    def __init__(self, pipe: Any, name: str):
        self.pipe, self.name = pipe, name

    def line(self, text: str, timeout: float) -> str:
        self.pipe.send(text + "\n")
        reply = self.pipe.readline(timeout)
        if reply is None:
            raise AgentError(f"{self.name}: no answer from the node agent within {timeout:g}s")
        return reply

    def request(self, req: dict, timeout: float) -> dict:
        reply = self.line(json.dumps(req), timeout)
        doc = decode(reply)
        if doc is None:
            raise AgentError(f"{self.name}: the node agent answered garbage: {reply[:120]}")
        if doc.get("error") and len(doc) == 1:
            raise AgentError(f"{self.name}: the node agent failed: {doc}")
        return doc

    def close(self) -> None:
        try:
            self.pipe.close()
        except Exception:
            pass

    def __enter__(self) -> "Agent":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def start_agent(session: Any, timeout: float = 20) -> Agent:
    node = session.node
    try:
        pipe = session.pipe([node.python, "-u", "-c", program("peer")])
    except Exception as exc:
        raise AgentError(str(exc) if node.name in str(exc) else f"{node.name}: {exc}") from None
    first = pipe.readline(timeout)
    if not (decode(first or "") or {}).get("ready"):
        pipe.close()
        raise AgentError(f"{node.name}: the node agent did not start with {node.python} "
                         f"({'no answer in %gs' % timeout if first is None else first[:120]})")
    return Agent(pipe, node.name)
