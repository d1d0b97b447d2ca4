"""Clock skew of a node against this machine by Cristian's method.

Each sample: note our wall clock t0, ask the node agent for its time T, note t1. The node's
clock was read somewhere between t0 and t1, so offset = T - (t0 + t1) / 2 with an error of at
most (t1 - t0) / 2; the sample with the shortest round trip is the best estimate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from node.lines import decode, encode

ASK_TIME = encode({"op": "t"})  # the peer agent (node/peer.py) answers {"t": its time.time()}

# A warning above this: merged logs come out of order, timestamps mislead.
WARN_S = 0.25
# A failure above this: c10d's rendezvous compares heartbeat timestamps written by other nodes
# (a node is dead when its last heartbeat looks older than 3 x 5 s); seconds of skew eat that margin.
FAIL_S = 3.0


@dataclass
class ClockSkew:
    offset_ms: float      # node minus this machine; positive = the node is ahead
    error_ms: float       # half the best round trip: the bound on the estimate's error
    samples: int

    def as_dict(self) -> dict:
        return {"offset_ms": round(self.offset_ms, 2), "error_ms": round(self.error_ms, 2), "samples": self.samples}


def best_offset(samples: list[tuple[float, float, float]]) -> ClockSkew:
    """samples: (t0, node_time, t1) in seconds. The sample with the shortest round trip wins."""
    if not samples:
        raise ValueError("no clock samples")
    t0, tn, t1 = min(samples, key=lambda s: s[2] - s[0])
    return ClockSkew(offset_ms=(tn - (t0 + t1) / 2) * 1000, error_ms=(t1 - t0) / 2 * 1000, samples=len(samples))


def measure_skew(agent: Any, samples: int = 8, timeout: float = 5) -> ClockSkew:
    """Sample the node agent's clock `samples` times (agent: netcheck.peer_agent_client.Agent)."""
    got = []
    for _ in range(samples):
        t0 = time.time()
        p0 = time.perf_counter()
        reply = agent.line(ASK_TIME, timeout)
        p1 = time.perf_counter()
        try:
            tn = float((decode(reply) or {})["t"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{agent.name}: the node agent sent {reply[:60]!r} instead of its time") from None
        # the round trip from the monotonic clock, so a step of our wall clock cannot distort it
        got.append((t0, tn, t0 + (p1 - p0)))
    return best_offset(got)
