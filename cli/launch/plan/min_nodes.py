"""training.elastic read for the plan: how many nodes a trainer run keeps (``min_nodes``: its default, 1 under a
strategy a node leaves in place, DiLoCo, else every node), and whether a node leaves in place (``in_place``: the
others' ranks go on without it, not restarted, so torchrun's agents wait at most EXIT_BARRIER_S at their end for one
another: node/torchrun.py). The leaves and returns themselves: cli/launch/supervise/elastic.py.

Imports auralm.parallel.strategy (no torch) where it is asked, nothing else.
"""

EXIT_BARRIER_S = 10.0  # a rank's end waits for no other node: a short wait only delays the run's end


def _leaves_in_place(t) -> bool:
    """Whether the run's strategy lets a node leave while the others go on (its registration says: DiLoCo)."""
    from auralm.parallel import strategy

    return strategy.entry(t.sync, t.parallel).in_place


def min_nodes(cfg, count: int) -> int:
    """training.elastic.min_nodes of the trainer's reading of the overrides (``cfg``, LaunchOptions.trainer; None when
    it refuses them, whose check says why: every node) (0: 1 under a strategy a node leaves in place, DiLoCo;
    else every node)."""
    if cfg is None:
        return count
    t = cfg.training
    return min(count, t.elastic.min_nodes or (1 if _leaves_in_place(t) else count))


def in_place(cfg, count: int) -> bool:
    """Whether a node may leave a trainer run of ``count`` nodes without the others restarting (DiLoCo)."""
    return count > 1 and cfg is not None and _leaves_in_place(cfg.training) and \
        min(count, cfg.training.elastic.min_nodes or 1) < count
