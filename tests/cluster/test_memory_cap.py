"""A lab node whose memory is capped by a cgroup (LabNode.limit_memory): `hrmctl train` with
training.batch_size=auto picks a smaller batch there than on the same node uncapped, and a fixed batch too
large for the cap fails with one line saying the node ran out of memory."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.trainer.helpers import QUIJOTE

CAP = 600 * 2**20
PLAN = re.compile(r"batch_size=auto: rank 0 fits (\d+) \((.*?)\), using (\d+) x accum (\d+) x 1 ranks = (\d+)")


@pytest.fixture(scope="module")
def text_on_node1(lab3, tmp_path_factory):
    from auralm import data

    local = tmp_path_factory.mktemp("lm") / "quijote"
    assert data.main([str(QUIJOTE), "--out", str(local), "--vocab-size", "512", "--max-tokens", "60000"]) == 0
    node = lab3.node("node1")
    parent = node.home / "hrmctl" / "data"  # the node's data directory: its user's, as the other tests expect
    parent.mkdir(exist_ok=True)
    shutil.chown(parent, node.user, node.user)
    target = parent / "quijote-memcap"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(local, target)
    for p in [target, *target.rglob("*")]:
        shutil.chown(p, node.user, node.user)
    return "~/hrmctl/data/quijote-memcap"


def _train(lab3, hrmctl, data_dir, run_id, *extra):
    return hrmctl("train", "--nodes", "node1", "--run-id", run_id, "task=lm", f"data_dir={data_dir}", "model=mini",
                  "training.max_steps=1", "training.eval_interval=0", "training.checkpoint_interval=0",
                  "training.dtype=fp32", "training.eval_batches=1", *extra, inventory=lab3.inventory, timeout=300)


def test_auto_batch_is_smaller_under_a_memory_cap_and_a_too_large_batch_says_the_node_ran_out(
        lab3, hrmctl, text_on_node1):
    node = lab3.node("node1")
    code, out, err = _train(lab3, hrmctl, text_on_node1, "memcap-free", "training.batch_size=auto")
    assert code == 0, out + err
    (free_fit, free_limit, *_), = PLAN.findall(out)
    print("uncapped:", PLAN.search(out).group(0))
    node.limit_memory(CAP)
    try:
        code, out, err = _train(lab3, hrmctl, text_on_node1, "memcap-auto", "training.batch_size=auto")
        assert code == 0, out + err
        (capped_fit, capped_limit, batch, accum, total), = PLAN.findall(out)
        print("capped:", PLAN.search(out).group(0))
        assert "available in the node's cgroup" in capped_limit, capped_limit
        assert 1 <= int(capped_fit) < int(free_fit), (capped_fit, free_fit)
        # the dry run sees the cap too (the probe's memory cgroup figure)
        code, dry, err = hrmctl("train", "--nodes", "node1", "--dry-run", "task=lm", f"data_dir={text_on_node1}",
                                "model=mini", "training.batch_size=auto", inventory=lab3.inventory, timeout=300)
        assert code == 0, dry + err
        m = re.search(r"# node1: batch_size=auto: about (\d+) rows per rank fit \(80% of ([\d.]+) GiB RAM", dry)
        print("dry run:", m and m.group(0))
        assert m and float(m.group(2)) < 0.6, dry
        # a fixed batch far past the cap: the rank is OOM-killed (or its allocation fails), and the line says so
        code, out, err = _train(lab3, hrmctl, text_on_node1, "memcap-oom", f"training.batch_size={int(free_fit)}")
        print("too large:", code, err.strip().splitlines()[-1:])
        assert code != 0, out + err
        assert ("was killed by SIGKILL: node1 ran out of memory (the kernel's OOM killer; lower training.batch_size" in err
                or "out of CPU memory: lower training.batch_size" in out + err), out + err
    finally:
        node.limit_memory(None)
