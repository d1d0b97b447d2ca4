"""A node that leaves a run and comes back (`training.elastic.min_nodes=K`, issue 36 items 2 and 3).

With K below the run's node count, a node lost during the run (cli/launch/run/attempt.py: no SSH keep-alive answer, its
connection broken), or whose rank or torchrun was killed by a signal (not the OOM killer: that would come back),
no longer ends it while K nodes remain and the lost one is not the master (rank 0 holds the checkpoints and the
rendezvous):

  - it is noted as left, with its time and what was seen (`hrmctl runs --json`: "members");
  - the others are restarted at once from the run's last checkpoint (resume=latest) with the nodes present: the
    world re-forms without it, and the global batch is kept by gradient accumulation
    (training.grad_accum x the old world / the new, when that divides; else the log says how it changed);
  - a watcher tries the lost node every REJOIN_POLL_S (a fresh connection, as the preflight makes); once it answers,
    what is left there of the run (its processes, found by their HRMCTL_JOB tag) is stopped, and, once the nodes
    present have logged a step (their ranks can take the signal), the run is restarted with it: the ranks present save a checkpoint first, at a step they agree on (cli/launch/run/save_stop.py),
    and every rank, the returning node's too, resumes from it: rank 0 loads it and broadcasts the weights and the
    optimizer state (auralm/training/checkpoint_manager.py), so the returning node takes them from a peer, never from a
    stale copy of its own.

Work lost: the steps since the last checkpoint, on a leave (at most training.checkpoint_interval); none on a join.
Under DiLoCo (``in_place``) the others are not restarted: their ranks find the silent one at the round's all-reduce
and finish the round without it (auralm/training/members.py); the launcher only notes the leave, keeps watching the
others, and takes the node back as above. Work lost there: the lost node's round. torchrun's agents then wait at
most EXIT_BARRIER_S at their end for one another (node/torchrun.py), since a node that left never comes.
Default K: 1 under training.sync=diloco, every node otherwise (a lost node stops the run, as before): both read for
the plan by cli/launch/plan/min_nodes.py.

Imports cli.nodes, cli.errors, the plan stage (min_nodes, options) and auralm.training.config (no torch).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from cli.errors import RemoteTimeout, UnreachableError
from cli.launch.plan.min_nodes import in_place, min_nodes
from cli.launch.plan.options import resume_latest
from cli.nodes.inventory import Node
from cli.nodes.remote import connect

REJOIN_POLL_S = 3.0


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class _Watcher(threading.Thread):
    """Tries a lost node until it answers; then stops what is left there of the run. ``back`` is set then."""

    def __init__(self, node: Node, tag: str, clear: Callable, accept_new_host_keys: bool):
        super().__init__(daemon=True)
        self.node, self.tag, self.clear, self.accept = node, tag, clear, accept_new_host_keys
        self.back = threading.Event()
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(REJOIN_POLL_S):
            try:
                with connect(self.node, accept_new_host_keys=self.accept, timeout=4) as session:
                    cleared = self.clear(session, self.tag)
            except Exception:  # not answering yet (or a surprise): try again
                continue
            if cleared:
                self.back.set()
                return


@dataclass
class Members:
    """The run's nodes (in the order asked; the first is the master), those present, and every leave and join."""

    nodes: list[Node]
    min_nodes: int
    tags: dict[str, str]  # node -> its job's HRMCTL_JOB tag
    clear: Callable  # clear(session, tag): stop what is left of the job with that tag on the node; whether it did
    accept_new_host_keys: bool = False
    chosen: str = ""  # how min_nodes was chosen when the overrides do not set it ("the default under DiLoCo")
    in_place: bool = False  # the ranks go on without a node that leaves, not restarted (DiLoCo)
    on_change: Callable = lambda: None  # a leave in place noted (for the run's status)
    present: list[str] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    watchers: dict[str, _Watcher] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.present = self.present or [n.name for n in self.nodes]

    @classmethod
    def of(cls, prep, clear: Callable) -> "Members | None":
        """For a trainer run of several nodes whose min_nodes lets one go; else None (a lost node stops the run)."""
        opts = prep.options
        nodes = [p.node for p in prep.plans]
        cfg = opts.trainer
        k = min_nodes(cfg, len(nodes)) if len(nodes) > 1 else len(nodes)
        if k >= len(nodes):
            return None
        given = "training.elastic.min_nodes" in cfg.given_keys
        return cls(nodes, k, {p.node.name: p.env["HRMCTL_JOB"] for p in prep.plans}, clear, opts.accept_new_host_keys,
                   "" if given else f" (the default under training.sync={cfg.training.sync})", in_place(cfg, len(nodes)))

    def said(self) -> str:
        """The run's rule, for the log's first lines."""
        return (f"training.elastic.min_nodes={self.min_nodes}{self.chosen}: a node but the master that stops "
                f"answering leaves the run while {self.min_nodes} node(s) remain, and rejoins when it answers")

    def can_go_on_without(self, name: str | None) -> bool:
        return name in self.present and name != self.nodes[0].name and len(self.present) - 1 >= self.min_nodes

    def now(self) -> list[Node]:
        return [n for n in self.nodes if n.name in self.present]

    def leaves_in_place(self, name: str, lost: bool, why: str, log) -> bool:
        """Whether node ``name``, ``lost`` (no answer) or its processes killed, leaves while the others' ranks go on
        without it; if so it is noted as left (and taken back when it answers)."""
        if not (self.in_place and lost and self.can_go_on_without(name)):
            return False
        self.leave(name, why, log)
        self.on_change()
        return True

    def leave(self, name: str, why: str, log) -> None:
        t = time.time()
        self.present.remove(name)
        self.events.append({"t": round(t, 3), "node": name, "event": "left", "why": why})
        how = ("without a restart: their ranks finish the round among themselves" if self.in_place else
               "from the last checkpoint")
        log.note(f"{name} left at {_clock(t)} ({why}); going on with {', '.join(self.present)} {how} "
                 f"(training.elastic.min_nodes={self.min_nodes}); {name} rejoins once it answers")
        w = self.watchers[name] = _Watcher(next(n for n in self.nodes if n.name == name), self.tags[name],
                                           self.clear, self.accept_new_host_keys)
        w.start()

    def returned(self) -> str | None:
        """A lost node that answers again (its leftovers stopped), if any."""
        return next((name for name, w in self.watchers.items() if w.back.is_set()), None)

    def join(self, name: str, log) -> None:
        t = time.time()
        self.watchers.pop(name)
        self.present = [n.name for n in self.nodes if n.name in self.present or n.name == name]
        self.events.append({"t": round(t, 3), "node": name, "event": "joined"})
        log.note(f"{name} joined at {_clock(t)}: the run goes on with {', '.join(self.present)} from the checkpoint "
                 f"just saved")

    def plan_present(self, plan: Callable, args: list[str], ranks: dict[str, int], log, record: Callable):
        """``plan(nodes, overrides)`` for the nodes present. A node that stops answering while it is made (its link
        cut again during a rejoin's preflight: no answer, or a command that did not finish; their message begins
        with the node's name) leaves again, when min_nodes allows, and the plan is made without it. A refused host
        key or login is not a leave: it stops the run. ``record()`` writes the leave down."""
        while True:
            now = self.now()
            try:
                return plan(now, self.args(args, sum(ranks.values()), sum(ranks[n.name] for n in now), log))
            except (UnreachableError, RemoteTimeout) as exc:
                name = str(exc).partition(":")[0]
                if not self.can_go_on_without(name):
                    raise
                self.leave(name, f"it stopped answering while the run was planned again ({exc})", log)
                record()

    def close(self) -> None:
        for w in self.watchers.values():
            w.halt.set()

    def args(self, args: list[str], world_all: int, world_now: int, log) -> list[str]:
        """The trainer's overrides for a restart with the nodes present: resume=latest, and the global batch of the
        whole world kept by gradient accumulation."""
        from auralm.training import command_line

        kept = [a for a in args if not a.lstrip("+").startswith("training.grad_accum=")]
        t = command_line.parse([a for a in args if not a.startswith("-")]).training
        accum = t.grad_accum
        if not t.global_batch_size and world_now != world_all:  # a global batch is split over any world by the trainer
            if (accum * world_all) % world_now == 0:
                accum = accum * world_all // world_now
            else:
                log.note(f"the global batch changes: {world_all} ranks' worth of training.grad_accum={accum} does "
                         f"not split over {world_now} ranks; give training.global_batch_size to keep it")
        return resume_latest([*kept, f"training.grad_accum={accum}"])
