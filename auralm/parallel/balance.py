"""Each rank's share of the work: ``training.balance=equal|auto|node0:2,node1:1``.

Under DDP a share is a part of the global batch (``batch_size x world`` rows a micro-step): rank r
takes b_r rows, and its loss is scaled by ``b_r x world / B`` so that DDP's average of the ranks'
gradients is the mean over all B rows, as one process would compute on the union of the batches.
Under DiLoCo every rank keeps ``batch_size`` and takes H_r local steps per round instead, so that
all ranks need about the same wall time; the round's average is weighted by the rows each saw.

``auto`` measures each rank's training speed with a few forward and backward passes before the
run starts (or reuses the shares of the checkpoint it resumes from, so a resumed run continues
exactly); weights per node name the node as the inventory does (the launcher passes it in
HRMCTL_JOB), or the host name when started without hrmctl; a node not named weighs 1.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass


def node_name() -> str:
    """This rank's node: the inventory's name (hrmctl sets HRMCTL_JOB=<run>/<node>), else the host name."""
    job = os.environ.get("HRMCTL_JOB", "")
    return job.split("/", 1)[1] if "/" in job else socket.gethostname()


def split(total: int, weights: list[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainder), every part at least 1."""
    n = len(weights)
    if total < n:
        raise ValueError(f"{total} cannot be split into {n} parts of at least 1")
    scaled = [total * w / sum(weights) for w in weights]
    parts = [max(1, math.floor(s)) for s in scaled]
    order = sorted(range(n), key=lambda i: scaled[i] - math.floor(scaled[i]), reverse=True)
    i = 0
    while sum(parts) < total:
        parts[order[i % n]] += 1
        i += 1
    while sum(parts) > total:  # only when a part was raised to 1: take from the largest
        parts[max(range(n), key=lambda k: parts[k])] -= 1
    return parts


@dataclass
class Shares:
    nodes: list[str]  # per rank
    weights: list[float]  # per rank: the given weight or the measured samples/s
    batch: list[int]  # rows per micro-step, per rank
    inner_steps: list[int]  # DiLoCo: local steps per full round of H, per rank (DDP: all 1)
    how: str  # equal, auto, or weights

    @property
    def equal(self) -> bool:
        return len(set(self.batch)) == 1 and len(set(self.inner_steps)) == 1

    def loss_scale(self, rank: int) -> float:
        """DDP: the factor on this rank's mean loss that makes the averaged gradient the global batch's mean."""
        return self.batch[rank] * len(self.batch) / sum(self.batch)

    def rows(self, rank: int) -> int:
        return self.batch[rank] * self.inner_steps[rank]

    def sample_weight(self, rank: int) -> float:
        """DiLoCo: this rank's part of the round's average (the rows it saw over all rows)."""
        return self.rows(rank) / sum(self.rows(r) for r in range(len(self.batch)))

    def global_factor(self, rank: int) -> float:
        """Rows of all ranks per row of this one (for a global samples/s seen from one rank)."""
        return sum(self.rows(r) for r in range(len(self.batch))) / self.rows(rank)

    def inner_steps_for(self, rank: int, round_steps: int, full: int) -> int:
        """This rank's local steps in a round of ``round_steps`` (``full`` = H; the last round may be shorter)."""
        if round_steps == full:
            return self.inner_steps[rank]
        return max(1, round(round_steps * self.inner_steps[rank] / full))

    def describe(self, unit: str) -> str:
        what = {"auto": f"measured {unit}", "weights": "weight"}.get(self.how, "")
        parts = []
        for r, node in enumerate(self.nodes):
            w = f"{what} {self.weights[r]:.0f}" if self.how == "auto" else f"{what} {self.weights[r]:g}"
            got = f"{self.inner_steps[r]} local steps a round" if len(set(self.inner_steps)) > 1 else \
                f"{self.batch[r]} rows a micro-step"
            parts.append(f"rank {r} ({node}): {w + ' -> ' if what else ''}{got}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {"nodes": self.nodes, "weights": self.weights, "batch": self.batch, "inner_steps": self.inner_steps,
                "how": self.how}


def decide(spec: str | dict, nodes: list[str], batch_size: int, diloco_steps: int | None,
           rates: list[float] | None = None) -> Shares:
    """The shares of every rank: ``nodes`` per rank, ``rates`` (samples/s per rank) for ``auto``;
    ``diloco_steps`` = H under DiLoCo, None under DDP."""
    world = len(nodes)
    if spec == "equal" or world == 1:
        weights, how = [1.0] * world, "equal"
    elif spec == "auto":
        weights, how = list(rates), "auto"
    else:
        weights, how = [float(spec.get(n, 1.0)) for n in nodes], "weights"
    if diloco_steps is None:
        batch = split(batch_size * world, weights) if how != "equal" else [batch_size] * world
        inner = [1] * world
    else:
        batch = [batch_size] * world
        inner = [max(1, round(diloco_steps * w / max(weights))) for w in weights]
    return Shares(nodes=nodes, weights=weights, batch=batch, inner_steps=inner, how=how)


def unknown_nodes(spec: str | dict, nodes: list[str]) -> list[str]:
    """Nodes named in the weights that are not in this run (a typo, most likely)."""
    return [] if isinstance(spec, str) else [n for n in spec if n not in nodes]
