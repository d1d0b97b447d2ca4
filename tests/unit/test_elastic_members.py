"""cli/launch/supervise/elastic.py's pure parts and cli/launch/plan/min_nodes.py: the default of
training.elastic.min_nodes, who may leave, and the overrides of a restart with fewer ranks (the global batch kept by
gradient accumulation). The leave and rejoin themselves run on real lab nodes: tests/cluster/test_elastic.py."""

from __future__ import annotations

from cli.launch.plan.min_nodes import min_nodes
from cli.launch.supervise.elastic import Members
from cli.nodes.inventory import Node


class _Log:
    def __init__(self):
        self.lines = []

    def note(self, text, *a, **k):
        self.lines.append(text)


def _members(k: int, names=("node0", "node1", "node2")) -> Members:
    nodes = [Node(name=n, host=f"10.0.0.{i + 1}", user="u") for i, n in enumerate(names)]
    return Members(nodes, k, {n: f"r/{n}" for n in names}, clear=lambda session, tag: True)


def test_min_nodes_defaults_to_one_under_diloco_and_every_node_otherwise():
    assert min_nodes(_trainer(["model=tiny"]), 3) == 3
    assert min_nodes(_trainer(["model=tiny", "training.sync=diloco"]), 3) == 1
    assert min_nodes(_trainer(["training.elastic.min_nodes=2"]), 3) == 2
    assert min_nodes(_trainer(["training.elastic.min_nodes=9"]), 3) == 3  # more than the run has: a lost node stops
    assert min_nodes(_trainer(["training.max_stepz=3"]), 3) == 3  # bad overrides: the trainer's check says so


def test_the_master_never_leaves_and_min_nodes_holds():
    m = _members(2)
    assert not m.can_go_on_without("node0") and m.can_go_on_without("node2") and not m.can_go_on_without("nodeX")
    m.present.remove("node2")
    assert not m.can_go_on_without("node1")  # 1 left would be below min_nodes=2


def test_a_restart_with_fewer_ranks_keeps_the_global_batch():
    log, m = _Log(), _members(1)
    assert m.args(["model=tiny", "training.batch_size=8"], 4, 2, log) == \
        ["model=tiny", "training.batch_size=8", "training.grad_accum=2", "resume=latest"]
    assert m.args(["training.grad_accum=3", "resume=latest", "--resume"], 2, 1, log) == \
        ["training.grad_accum=6", "resume=latest"]
    assert m.args(["training.grad_accum=2"], 2, 2, log) == ["training.grad_accum=2", "resume=latest"] and not log.lines
    assert m.args(["training.batch_size=8"], 3, 2, log)[-2:] == ["training.grad_accum=1", "resume=latest"]
    assert "the global batch changes" in log.lines[-1]
    # a global batch the trainer splits over any world itself: the user's accumulation stays
    assert m.args(["training.global_batch_size=64"], 4, 2, log)[-2:] == ["training.grad_accum=1", "resume=latest"]


def test_a_node_lost_again_while_the_run_is_planned_again_leaves_and_the_plan_is_made_without_it():
    """A rejoin's preflight that finds the node gone again (its link cut once more) is a leave, not the run's end;
    the master, or a node that min_nodes needs, still stops the run, and so does a refused host key."""
    import pytest

    from cli.errors import HostKeyError, RemoteTimeout, UnreachableError

    log, m, recorded = _Log(), _members(1), []
    asked = []

    def plan(nodes, args):
        asked.append([n.name for n in nodes])
        if "node1" in asked[-1]:
            raise RemoteTimeout("node1: `python - --no-torch` did not finish in 60s; it was stopped")
        return ("plan", [n.name for n in nodes], args)

    try:
        got = m.plan_present(plan, ["training.batch_size=8"], {"node0": 1, "node1": 1, "node2": 1}, log,
                             lambda: recorded.append(len(m.events)))
        assert asked == [["node0", "node1", "node2"], ["node0", "node2"]]
        assert got[1] == ["node0", "node2"] and got[2][-1] == "resume=latest"
        assert [(e["node"], e["event"]) for e in m.events] == [("node1", "left")] and recorded == [1]
        assert "did not finish in 60s" in m.events[0]["why"] and any("node1 left at" in line for line in log.lines)

        def master_gone(nodes, args):
            raise UnreachableError("node0: no answer from 10.0.0.1:22 within 4s")
        with pytest.raises(UnreachableError):
            m.plan_present(master_gone, [], {"node0": 1, "node1": 1, "node2": 1}, log, lambda: None)

        def changed_key(nodes, args):
            raise HostKeyError("node2: HOST KEY CHANGED for 10.0.0.3:22")
        with pytest.raises(HostKeyError):
            m.plan_present(changed_key, [], {"node0": 1, "node1": 1, "node2": 1}, log, lambda: None)
    finally:
        m.close()


def _trainer(args: list[str]):
    """The trainer's reading of ``args`` as a launch gives it to the stages (None: refused)."""
    from cli.launch.plan.options import LaunchOptions

    return LaunchOptions(nodes=[], args=args).trainer
