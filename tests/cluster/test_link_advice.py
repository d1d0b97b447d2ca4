"""What the link means for training, on real lab nodes: `hrmctl test-ddp` times the model on both nodes and
predicts DDP's communication from the all_reduce it measured, saves the figures, and `hrmctl train` warns
from them before a run where communication would dominate — on the lab's LAN (it should not) and on a link
shaped down to a few Mbit/s inside a node's namespace (it should). Those two run beside the other tests: they check
that the warning agrees with the figures test-ddp measured, whatever the load made of them, and a 5 Mbit/s link's
seconds against the tiny model's hundredths of a second. The node at a third of a core compares two nodes' speeds, so
it runs `alone` (scripts/test.sh)."""

from __future__ import annotations

import json

import pytest

from auralm.planning import link_budget as lb

MODEL = ["model=tiny", "task=lm"]


def _test_ddp(hrmctl, lab, cache, *extra: str) -> dict:
    code, out, err = hrmctl("test-ddp", "--nodes", "node0,node1", *MODEL, "--json", *extra,
                            inventory=lab.inventory, env={"HRMCTL_CACHE": str(cache)}, timeout=600)
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["result"]["ok"] and doc["link_cache"] == str(cache / "links.json")
    return doc["result"]["training"]


def _check_section(tr: dict) -> None:
    m, c = tr["model"], tr["compute"]
    assert (m["name"], m["task"], m["vocab"], m["batch_size"]) == ("tiny", "lm", lb.DEFAULT_LM_VOCAB, 64)
    assert tr["world"] == 2 and tr["parameters"] == m["parameters"] > 0
    assert c["error"] is None and c["steps_timed"] >= 1 and len(c["s_by_rank"]) == 2
    assert tr["compute_s"] == c["s_per_step"] == max(c["s_by_rank"]) > 0
    assert c["s_per_step_by_rank"] == [t * m["grad_accum"] for t in c["s_by_rank"]]
    assert tr["busbw_GBps"] > 0 and tr["latency_us"] > 0
    assert tr["ddp"]["comm_s"] > tr["ddp_bf16"]["comm_s"] > 0 and tr["ddp"]["bytes"] == 4 * m["parameters"]
    assert tr["ddp"]["ratio"] == pytest.approx(tr["ddp"]["comm_s"] / tr["ddp"]["compute_s"])
    s = tr["suggestion"]
    assert s["sync"] in ("ddp", "diloco") and s["why"] and tr["text"]
    # the section is link_budget's own prediction from these very figures
    again = lb.budget(busbw_GBps=tr["busbw_GBps"], latency_us=tr["latency_us"], world=2,
                      parameters=m["parameters"], compute_s=tr["compute_s"], powersgd=m["powersgd"],
                      compute_by_rank=[t * m["grad_accum"] for t in c["s_by_rank"]], max_steps=m["max_steps"])
    assert again["suggestion"] == s and again["ddp"] == tr["ddp"] and again["ddp_powersgd"] == tr["ddp_powersgd"]
    assert 0 < tr["ddp_powersgd"]["bytes"] < tr["ddp_bf16"]["bytes"]  # rank-2 factors: less than half the bytes
    assert (s["balance"] == "auto") == tr["balance"]["suggest"] == (s["overrides"][:1] == ["training.balance=auto"])


def _cached(cache, tr: dict) -> dict:
    entry = json.loads((cache / "links.json").read_text())["node0,node1"]
    assert entry["nodes"] == ["node0", "node1"] and entry["world"] == 2 and entry["backend"] == "gloo"
    assert (entry["busbw_GBps"], entry["latency_us"]) == (tr["busbw_GBps"], tr["latency_us"])
    assert entry["compute"]["s_per_step"] == tr["compute_s"] and entry["compute"]["name"] == "tiny"
    return entry


def _train_dry_run(hrmctl, lab, cache, data_dir: str, *extra: str) -> tuple[dict, str]:
    code, out, err = hrmctl("train", "--nodes", "node0,node1", "--dry-run", "--json", *MODEL, f"data_dir={data_dir}",
                            *extra, inventory=lab.inventory, env={"HRMCTL_CACHE": str(cache)})
    assert code == 0, out + err
    return json.loads(out)["link"], err


def _consistent(link: dict, err: str, entry: dict, tr: dict) -> None:
    """The warning is there exactly when the cached figures say DDP's communication exceeds the compute."""
    assert not link["estimated"] and link["compute_s"] == pytest.approx(entry["compute"]["s_per_step"])
    assert link["comm_s"] == pytest.approx(tr["ddp"]["comm_s"])
    dominates = tr["ddp"]["comm_s"] > tr["compute_s"]
    assert link["warn"] == (dominates or tr["balance"]["suggest"])  # or the ranks differ and the run has equal shares
    assert ("warning: node0,node1: DDP would spend" in err) == dominates
    assert link["suggestion"] == tr["suggestion"]


def test_lan_link_budget_is_saved_and_train_agrees_with_it(lab3, hrmctl, tmp_path, text_on_nodes):
    cache = tmp_path / "cache"
    tr = _test_ddp(hrmctl, lab3, cache, "--max-size", "4MiB", "--seconds", "0.05")
    _check_section(tr)
    entry = _cached(cache, tr)
    link, err = _train_dry_run(hrmctl, lab3, cache, text_on_nodes)
    _consistent(link, err, entry, tr)
    print(f"LAN: busbw {tr['busbw_GBps'] * 1e3:.0f} MB/s, latency {tr['latency_us']:.0f} us, "
          f"compute {tr['compute_s']:.3f} s/step ({tr['compute']['steps_timed']} steps), "
          f"ddp {tr['ddp']['comm_s'] * 1e3:.2f} ms/step; {tr['suggestion']['overrides']}")


def _shape(node, rate_mbit: float | None) -> None:
    if hasattr(node, "shape_link"):  # lab/nodes.py's helper, where it exists
        node.shape_link(rate_mbit)
    elif rate_mbit is None:
        node.netns(["tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
    else:
        node.netns(["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", f"{rate_mbit:g}mbit", "burst",
                    "64kb", "latency", "50ms"])


def test_slow_link_makes_train_warn_with_the_suggested_overrides(lab3, hrmctl, tmp_path, text_on_nodes):
    cache = tmp_path / "cache"
    node1 = lab3.node("node1")
    # 2 Mbit/s: the tiny model's 2.5 MB of gradients take about 10 s, its compute a fraction of one on a quiet 2-core
    # machine; at 5 Mbit/s (3.9 s) a fresh machine's loaded suite once timed its step at 4.2 s, so the verdict
    # depended on the load: 10 s leaves room for a step more than ten times slower than a quiet one
    _shape(node1, 2)
    try:
        tr = _test_ddp(hrmctl, lab3, cache, "--max-size", "256KiB", "--seconds", "0.05")
    finally:
        _shape(node1, None)
    _check_section(tr)
    assert tr["busbw_GBps"] < 0.001  # below 1 MB/s: the shaping is what was measured
    assert tr["ddp"]["comm_s"] > tr["compute_s"] and tr["suggestion"]["sync"] == "diloco"
    H, K, C = (tr["suggestion"][k] for k in ("inner_steps", "overlap_steps", "compress"))
    overlap = [f"training.diloco.overlap_steps={K}"] if K else []
    compress = [f"training.diloco.compress={C}"] if C != "bf16" else []  # quantised where that takes fewer steps
    assert C == tr["diloco"]["compress"] and H == tr["diloco"]["by_compress"][C]["inner_steps"]
    assert H == min(entry["inner_steps"] for entry in tr["diloco"]["by_compress"].values())
    shares = ["training.balance=auto"] if tr["balance"]["suggest"] else []  # two namespaces of one machine: rarely
    # a run of the trainer's default 1000 steps: its outer step is left to the trainer's default (auto), which takes
    # the ranks' average for fewer than FEW_ROUNDS rounds of H (the reason says so), so no override of it
    assert tr["max_steps"] == 1000
    assert ("the default outer step (training.diloco.outer_lr=auto) is the ranks' plain average" in
            tr["suggestion"]["why"]) == (1000 // H < lb.FEW_ROUNDS)
    sync = ["training.sync=diloco", f"training.diloco.inner_steps={H}", *compress, *overlap]
    assert tr["suggestion"]["overrides"] == [*shares, *sync]
    assert tr["diloco"]["ratio"] <= lb.DILOCO_OK
    assert K == lb.overlap_steps(tr["diloco"]["comm_s_per_sync"], tr["diloco"]["compute_s"], H)
    entry = _cached(cache, tr)
    # the figures are cached: the link need not be slow now
    link, err = _train_dry_run(hrmctl, lab3, cache, text_on_nodes)
    _consistent(link, err, entry, tr)
    line = next(l for l in err.splitlines() if l.startswith("warning: node0,node1:"))
    assert line.endswith(" ".join(["try", *shares, *sync]))
    # asking for DiLoCo already: nothing to say of the communication; its rounds' wire, left to hrmctl, is the one
    # this link calls for at the run's H (the default 50), in the plan (the dry run's commands) and said
    code, out, err = hrmctl("train", "--nodes", "node0,node1", "--dry-run", "--json", *MODEL,
                            f"data_dir={text_on_nodes}", "training.sync=diloco", inventory=lab3.inventory,
                            env={"HRMCTL_CACHE": str(cache)})
    assert code == 0, out + err
    link, wire = json.loads(out)["link"], lb.compress_for(tr, 50)["compress"]
    assert link["sync"] == "diloco" and "DDP would spend" not in err
    assert (f"training.diloco.compress={wire}" in out) == (wire != "bf16"), out
    assert (f"diloco: rounds sent as {wire}, chosen from test-ddp's figures for node0,node1" in err) == \
        (wire != "bf16"), err
    # and its streaming for that wire, when a round's all-reduce would make the ranks wait: overlapped, in parts
    stream = lb.fragments_for(tr, 50, wire)
    chosen = [f"training.diloco.fragments={stream['fragments']}"] * (stream["fragments"] > 1) + \
        [f"training.diloco.overlap_steps={stream['overlap_steps']}"] if stream and stream["fragments"] else []
    assert all(c in out for c in chosen) and ("training.diloco.overlap_steps=" in out) == bool(chosen), out
    assert ("diloco: " + stream["why"] in err if stream and not stream["fragments"] else True), err
    print(f"2 Mbit/s: busbw {tr['busbw_GBps'] * 1e6:.0f} KB/s, latency {tr['latency_us']:.0f} us, "
          f"compute {tr['compute_s']:.3f} s/step, ddp {tr['ddp']['comm_s']:.2f} s/step; {tr['suggestion']['overrides']}")


@pytest.mark.alone  # node0 on a core of its own, node1 on the other at a third of it: nothing else on those cores
def test_a_node_at_a_third_of_a_core_gets_work_shares_suggested(lab3, hrmctl, tmp_path, text_on_nodes):
    """node0 on a core of its own, node1 on the other held to a third of it (a cgroup CPU quota): test-ddp times
    the model on each, finds node1 about three times slower and suggests shares by speed; `hrmctl train` with equal
    shares warns, with training.balance=auto it does not."""
    cache = tmp_path / "cache"
    lab3.node("node0").limit_cpu(cpus="0")
    lab3.node("node1").limit_cpu(cpus="1", quota=0.33)
    try:
        tr = _test_ddp(hrmctl, lab3, cache, "--max-size", "1MiB", "--seconds", "0.05")
    finally:
        for name in ("node0", "node1"):
            lab3.node(name).limit_cpu()
    _check_section(tr)
    bal, s = tr["balance"], tr["suggestion"]
    fast, slow = tr["compute"]["s_by_rank"]  # rank 0 is node0
    assert slow > 1.8 * fast, tr["compute"]["s_by_rank"]
    assert bal["suggest"] and bal["gain"] == pytest.approx((1 + slow / fast) / 2)
    assert bal["auto_s"] == pytest.approx(2 / (1 / fast + 1 / slow)) and bal["equal_s"] == slow
    assert s["balance"] == "auto" and s["overrides"][0] == "training.balance=auto"
    assert tr["ddp"]["compute_s"] == pytest.approx(bal["auto_s"])  # the ratios are the balanced run's
    link, err = _train_dry_run(hrmctl, lab3, cache, text_on_nodes)
    assert link["warn"] and link["balance"] == "equal"
    line = next(l for l in err.splitlines() if l.startswith("warning: node0,node1:"))
    assert "this run gives them equal shares" in line and line.endswith(
        f"try training.balance=auto (about {bal['gain']:.2f}x the samples/s)")
    link, err = _train_dry_run(hrmctl, lab3, cache, text_on_nodes, "training.balance=auto")
    assert not link["warn"] and "warning: node0,node1" not in err
    print(f"node1 at a third of a core: compute {fast:.3f} s and {slow:.3f} s a step, shares by speed "
          f"{bal['gain']:.2f}x; {s['overrides']}")
