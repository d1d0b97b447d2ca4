"""Low-communication training and work shares on real lab nodes: DDP against DiLoCo over shaped links,
and equal against measured shares with one node at half a core.

    python bench/lowcomm.py targets [--steps 24] [--model small] [--batch 16] [--inner 8] [--overlap 2] [--modes ...]
    [--links ...]
    python bench/lowcomm.py balance [--steps 40] [--model mini]
    python bench/lowcomm.py table   [--steps 24] [--model mini] [--inner 8]
    python bench/lowcomm.py compress [--steps 48] [--model small] [--inner 8] [--link wifi]
    python bench/lowcomm.py unequal [--steps 240] [--model mini] [--inner 40] [--link wifi] [--slow-at 0.3]
    python bench/lowcomm.py defaults [--steps 48] [--model small] [--inner 8] [--link wifi]

Every run is `hrmctl train` on lab nodes (lab/nodes.py: real sshd, real torchrun, gloo over the
lab's bridge), task=lm on the Spanish text of ../shared/data, fp32. Each node is pinned to a core of
its own with a cgroup (node i on core i mod 2), so a node is a one-core machine; links are shaped in
both directions with HTB (rate) and an added round-trip time (netem, or the lab's NFQUEUE delayer
where the kernel has no netem: see lab/nodes.py). Samples/s is measured from the run's metrics over
the steps after the first log record (start-up, the first steps and the final evaluation are not in
it): (samples between the first and the last record) / (training seconds between them).

targets: one node alone; the two each alone at the same time (the ceiling: no communication, the
         machine's memory shared); two nodes under DDP and DiLoCo on the plain LAN and at 200 Mbit/s +3 ms
         (DiLoCo with the paper's outer step, and with outer lr 1 and no momentum: the plain average; each
         also with its all-reduce overlapping the next round's first --overlap local steps);
         validation loss at the end (equal samples: the same steps and global batch).
balance: node1 at 50% of its core; node0 alone, node1 alone, the pair with equal shares and with
         balance=auto, under DDP (and DiLoCo with auto).
table:   mode x link (LAN, 200 Mbit/s +3 ms, 50 Mbit/s +20 ms) x nodes (1, 2, 3), every node at half a
         core (three nodes on two cores), speed-up over one node and final validation loss.
unequal: four nodes of half a core each (two on each core) on the crowded Wi-Fi below, under DiLoCo: one node alone,
         a quarter-core node alone, the four with rounds by time (training.diloco.inner_steps=auto); then the four
         with node3 capped to a quarter core once the run is --slow-at through (a laptop that slows mid-run), with
         fixed rounds of H steps and with rounds by time: tokens/s after the cap against the ideal sum (three
         half-core nodes and one quarter-core node, each alone).
compress: two nodes on a crowded Wi-Fi (each node's link 50 Mbit/s, 5 +- 2.5 ms and 1% of its arriving packets
         lost: 10 +- 5 ms more round trip, 1% loss each way) under DDP and under DiLoCo with its rounds sent as
         bf16, int8 and int4 (training.diloco.compress; the outer step the default's), against one node:
         tokens/s, final validation loss against DDP's, and the bytes each rank sent for its last round.
defaults: the same two nodes on the same Wi-Fi as a user meets them: `hrmctl test-ddp` first (its figures cached for
         `hrmctl train`), then DiLoCo of H steps with training.diloco.compress, fragments and overlap_steps left to
         hrmctl, against one node and against the rounds sent as int4 with no streaming.
Root only. Figures go to stdout as markdown tables (docs/lowcomm.md has the last ones).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _handrun import hrmctl  # noqa: E402
# the outer step: the ranks' average, the paper's
from auralm.planning.link_budget import AVERAGE, PAPER_STEP  # noqa: E402
from lab.links import LINKS, NAMES, shape  # noqa: E402
from lab.nodes import Lab  # noqa: E402

QUIJOTE = ROOT.parent / "shared" / "data" / "quijote" / "pg2000.txt"


def prepare(lab: Lab, tmp: Path) -> None:
    """The same prepared text on every node (as `hrmctl sync-data` would leave it)."""
    from cli.app import main as cli_main  # hrmctl prepare-data, in this process

    local = tmp / "quijote"
    assert cli_main(["prepare-data", str(QUIJOTE), "--out", str(local), "--vocab-size", "4096",
                     "--max-tokens", "400000"]) == 0
    for node in lab.nodes:
        target = node.home / "hrmctl" / "data" / "quijote"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(local, target)
        shutil.chown(target.parent, node.user, node.user)
        for p in [target, *target.rglob("*")]:
            shutil.chown(p, node.user, node.user)


def train(lab: Lab, nodes: list[str], run_id: str, args: list[str], cwd: Path) -> dict:
    """One `hrmctl train` run; its figures."""
    began = time.monotonic()
    hrmctl(lab, "train", "--nodes", ",".join(nodes), "--run-id", run_id, *args, cwd=cwd)
    return figures(lab, nodes, run_id, time.monotonic() - began)


def figures(lab: Lab, nodes: list[str], run_id: str, wall: float, since_step: int = 0) -> dict:
    """A run's samples/s (after the first record, or the first at or after ``since_step``), final val_loss, wall
    time."""
    run = lab.node(nodes[0]).home / "hrmctl" / "runs" / run_id
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    cfg = json.loads((run / "config.json").read_text())
    rows = [r for r in rows if r["step"] >= since_step]
    if len(rows) < 2:  # no figure rather than a wrong one (a cap that came at the run's end)
        raise SystemExit(f"{run_id}: fewer than two records from step {since_step} on: no speed to measure")
    first, last = rows[0], rows[-1]
    if any("round_steps" in r for r in rows):  # rounds by time: every rank's local steps a round (a record each)
        rounds = [r for r in rows if "round_steps" in r]
        first, last = rounds[0], rounds[-1]
        tokens = sum(sum(r["round_steps"]) for r in rounds[1:]) * cfg["training"]["batch_size"] * \
            cfg["model"]["block_size"]
        return {"tokens_per_s": tokens / (last["train_s"] - first["train_s"]), "val_loss": rows[-1].get("val_loss"),
                "wall_s": wall, "steps": last["step"], "shares": None, "round_bytes": last.get("round_bytes"),
                "round_steps": last["round_steps"]}
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()] \
        if (run / "events.jsonl").exists() else []
    shares = next((e for e in events if e["kind"] == "balance"), None)
    per_step = sum(shares["batch"]) if shares and cfg["training"]["sync"] == "ddp" else \
        cfg["training"]["batch_size"] * len(nodes)
    if shares and cfg["training"]["sync"] == "diloco":  # samples of a round, over the round's H steps
        per_step = sum(shares["inner_steps"]) * cfg["training"]["batch_size"] / cfg["training"]["diloco"]["inner_steps"]
    tokens = cfg["model"]["block_size"] * per_step
    rate = (last["step"] - first["step"]) * tokens / (last["train_s"] - first["train_s"])
    return {"tokens_per_s": rate, "val_loss": last.get("val_loss"), "wall_s": wall, "steps": last["step"],
            "shares": shares and shares["message"], "round_bytes": last.get("round_bytes")}


def done(lab: Lab, out: list[str]) -> None:
    """The links back to the LAN's, and the table on stdout."""
    shape(lab, "LAN")
    print("\n".join(out))


def common(a) -> list[str]:
    return ["task=lm", "data_dir=~/hrmctl/data/quijote", f"model={a.model}", f"training.batch_size={a.batch}",
            f"training.max_steps={a.steps}", "training.dtype=fp32", "training.eval_interval=0",
            "training.checkpoint_interval=0", "training.sample_tokens=0", "training.log_interval=1",
            f"training.warmup_steps={max(1, a.steps // 6)}", "training.eval_batches=16", "guard.snapshot_every=1000"]


def diloco(a, h: int | None = None) -> list[str]:
    """DiLoCo with the paper's outer step, whatever the run's length (the default, auto, averages below
    FEW_ROUNDS rounds); AVERAGE after it overrides it (the last value of a key wins)."""
    return ["training.sync=diloco", f"training.diloco.inner_steps={h or a.inner}", *PAPER_STEP]


def row(label: str, r: dict, base: float | None) -> str:
    speed = f"{r['tokens_per_s'] / base:.2f}x" if base else "1.00x"
    loss = f"{r['val_loss']:.4f}" if r["val_loss"] is not None else "-"
    return f"| {label} | {r['tokens_per_s']:.0f} | {speed} | {loss} | {r['wall_s']:.0f} s |"


def targets(lab: Lab, a, cwd: Path) -> None:
    lab.pin_cores()
    out = ["| run | tokens/s | vs one node | final val loss | wall |", "|---|---|---|---|---|"]
    shape(lab, "LAN")
    one = train(lab, ["node0"], "t-one", common(a), cwd)
    out.append(row("node0 alone", one, None))
    if "ceiling" in a.modes:  # node0 and node1 each alone, at the same time: what two one-core nodes sharing
        # this machine's memory and caches give with no communication at all, the most any pair can
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda n: train(lab, [n], f"t-ceiling-{n}", common(a), cwd), ("node0", "node1")))
        out.append(f"| node0 and node1 each alone, at once (no communication) | "
                   f"{sum(r['tokens_per_s'] for r in both):.0f} | "
                   f"{sum(r['tokens_per_s'] for r in both) / one['tokens_per_s']:.2f}x | - | "
                   f"{max(r['wall_s'] for r in both):.0f} s |")
        print(out[-1], file=sys.stderr, flush=True)
    results = {}
    for link in a.links:
        shape(lab, link)
        overlap = [f"training.diloco.overlap_steps={a.overlap}"]
        for mode, extra in (("ddp", []), ("ddp-bf16", ["training.ddp_comm_hook=bf16"]), ("diloco", diloco(a)),
                            ("diloco-overlap", diloco(a) + overlap), ("diloco-avg", diloco(a) + list(AVERAGE)),
                            ("diloco-avg-overlap", diloco(a) + list(AVERAGE) + overlap)):
            if mode not in a.modes or mode.startswith("diloco-avg") and link == "LAN":
                continue
            r = train(lab, ["node0", "node1"], f"t-{mode}-{link.replace('+', '')}", common(a) + extra, cwd)
            results[(mode, link)] = r
            label = {"ddp": "ddp", "ddp-bf16": "ddp, bf16 comm hook", "diloco": f"diloco H={a.inner}",
                     "diloco-overlap": f"diloco H={a.inner}, overlap {a.overlap}",
                     "diloco-avg": f"diloco H={a.inner}, outer lr 1, no momentum",
                     "diloco-avg-overlap": f"diloco H={a.inner}, outer lr 1, no momentum, overlap {a.overlap}"}[mode]
            out.append(row(f"2 nodes, {label}, {link}", r, one["tokens_per_s"]))
            print(out[-1], file=sys.stderr, flush=True)
    done(lab, out)
    ref = results.get(("ddp", "LAN"), {}).get("val_loss") or a.ddp_loss
    for key, r in results.items():
        if ref is None:
            print(f"val loss {key}: {r['val_loss']:.4f}")
            continue
        print(f"val loss {key}: {r['val_loss']:.4f} ({(r['val_loss'] / ref - 1) * 100:+.1f}% against ddp on the LAN)")


def balance(lab: Lab, a, cwd: Path) -> None:
    lab.pin_cores()
    lab.node("node1").limit_cpu(cpus="1", quota=0.5)
    out = ["| run | tokens/s | share of the sum | final val loss | wall |", "|---|---|---|---|---|"]
    alone = {n: train(lab, [n], f"b-{n}", common(a), cwd) for n in ("node0", "node1")}
    total = sum(r["tokens_per_s"] for r in alone.values())
    for n, r in alone.items():
        out.append(row(f"{n} alone" + (" (50% CPU)" if n == "node1" else ""), r, total).replace("x |", " of the sum |"))
    for label, extra in (("pair, ddp, equal shares", []), ("pair, ddp, balance=auto", ["training.balance=auto"]),
                         ("pair, ddp, balance=auto, bf16 hook", ["training.balance=auto", "training.ddp_comm_hook=bf16"]),
                         ("pair, diloco, balance=auto", ["training.balance=auto"] + diloco(a))):
        r = train(lab, ["node0", "node1"], "b-" + label.replace(", ", "-").replace("=", "").replace(" ", ""),
                  common(a) + extra, cwd)
        out.append(row(label, r, total).replace("x |", " of the sum |"))
        if r["shares"]:
            out.append(f"|  {r['shares']} | | | | |")
        print(out[-1], file=sys.stderr, flush=True)
    lab.node("node1").limit_cpu(cpus="1")
    print("\n".join(out))


def table(lab: Lab, a, cwd: Path) -> None:
    lab.pin_cores(quota=0.5)
    out = ["| mode | link | nodes | tokens/s | speed-up | final val loss |", "|---|---|---|---|---|---|"]
    shape(lab, "LAN")
    one = train(lab, ["node0"], "x-one", common(a), cwd)
    out.append(f"| - | - | 1 | {one['tokens_per_s']:.0f} | 1.00x | {one['val_loss']:.4f} |")
    for link in LINKS:
        shape(lab, link)
        for n in (2, 3):
            for mode, extra in (("ddp", []), ("diloco", diloco(a))):
                r = train(lab, [f"node{i}" for i in range(n)], f"x-{mode}-{link.replace('+', '')}-{n}",
                          common(a) + extra, cwd)
                out.append(f"| {mode}{' H=' + str(a.inner) if extra else ''} | {link} | {n} | {r['tokens_per_s']:.0f}"
                           f" | {r['tokens_per_s'] / one['tokens_per_s']:.2f}x | {r['val_loss']:.4f} |")
                print(out[-1], file=sys.stderr, flush=True)
    done(lab, out)


def compress(lab: Lab, a, cwd: Path) -> None:
    lab.pin_cores()
    out = ["| run | tokens/s | vs one node | final val loss | vs DDP | sent a round, each rank | wall |",
           "|---|---|---|---|---|---|---|"]
    shape(lab, "LAN")
    one = train(lab, ["node0"], "c-one", common(a), cwd)
    out.append(f"| node0 alone | {one['tokens_per_s']:.0f} | 1.00x | {one['val_loss']:.4f} | | | {one['wall_s']:.0f} s |")
    shape(lab, a.link)
    ddp = None
    for label, extra in (("ddp", []), *((f"diloco H={a.inner}, {kind}", ["training.sync=diloco",
                         f"training.diloco.inner_steps={a.inner}", f"training.diloco.compress={kind}"])
                         for kind in ("bf16", "int8", "int4"))):
        r = train(lab, ["node0", "node1"], "c-" + label.replace(" ", "").replace(",", "-").replace("=", ""),
                  common(a) + extra, cwd)
        ddp = ddp or r
        sent = f"{r['round_bytes'] / 1e6:.2f} MB" if r["round_bytes"] else "-"
        out.append(f"| 2 nodes, {label}, {a.link} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / one['tokens_per_s']:.2f}x"
                   f" | {r['val_loss']:.4f} | {(r['val_loss'] / ddp['val_loss'] - 1) * 100:+.2f}% | {sent} | "
                   f"{r['wall_s']:.0f} s |")
        print(out[-1], file=sys.stderr, flush=True)
    done(lab, out)


def defaults(lab: Lab, a, cwd: Path) -> None:
    """A user's path on the crowded Wi-Fi: test-ddp measures the two nodes and the model, then DiLoCo of H steps with
    its wire and streaming left to hrmctl (what it chose is in the run's config.json), against one node and against
    the same rounds sent as int4 with no streaming (the best row of `compress`)."""
    lab.pin_cores()
    out = ["| run | tokens/s | vs one node | final val loss | vs int4 | chosen | wall |", "|---|---|---|---|---|---|---|"]
    shape(lab, "LAN")
    one = train(lab, ["node0"], "d-one", common(a), cwd)
    out.append(f"| node0 alone | {one['tokens_per_s']:.0f} | 1.00x | {one['val_loss']:.4f} | | | {one['wall_s']:.0f} s |")
    shape(lab, a.link)
    cache = cwd / "cache"
    env = {"HRMCTL_CACHE": str(cache)}
    model = [k for k in common(a) if k.split("=")[0] in ("task", "data_dir", "model", "training.batch_size")]
    hrmctl(lab, "test-ddp", "--nodes", "node0,node1", "--json", "--max-size", "16MiB", *model, cwd=cwd, extra_env=env)
    rounds = ["training.sync=diloco", f"training.diloco.inner_steps={a.inner}"]
    int4 = None
    for label, extra in (("int4, no streaming", ["training.diloco.compress=int4", "training.diloco.overlap_steps=0"]),
                         ("left to hrmctl", [])):
        run_id = "d-" + label.replace(" ", "").replace(",", "-")
        began = time.monotonic()
        res = hrmctl(lab, "train", "--nodes", "node0,node1", "--run-id", run_id, *common(a), *rounds, *extra,
                     cwd=cwd, extra_env=env)
        r = figures(lab, ["node0", "node1"], run_id, time.monotonic() - began)
        int4 = int4 or r
        d = json.loads((lab.node("node0").home / "hrmctl" / "runs" / run_id / "config.json").read_text())[
            "training"]["diloco"]
        chosen = f"{d['compress']}, fragments={d['fragments']}, overlap_steps={d['overlap_steps']}"
        said = [line for line in res.stderr.splitlines() if line.startswith("diloco: ")]
        print("\n".join(said), file=sys.stderr, flush=True)
        out.append(f"| 2 nodes, diloco H={a.inner}, {label}, {a.link} | {r['tokens_per_s']:.0f} | "
                   f"{r['tokens_per_s'] / one['tokens_per_s']:.2f}x | {r['val_loss']:.4f} | "
                   f"{(r['val_loss'] / int4['val_loss'] - 1) * 100:+.2f}% | {chosen} | {r['wall_s']:.0f} s |")
        print(out[-1], file=sys.stderr, flush=True)
    done(lab, out)


def unequal(lab: Lab, a, cwd: Path) -> None:
    lab.pin_cores(quota=0.5)
    slow, core = lab.node("node3"), str(_cores()[3 % len(_cores())])
    out = ["| run | tokens/s | against | final val loss | wall |", "|---|---|---|---|---|"]
    shape(lab, "LAN")
    slow.limit_cpu(cpus=core, quota=0.25)
    with ThreadPoolExecutor(2) as pool:  # on cores of their own (node0 on the first, node3 on the second)
        one, quarter = pool.map(lambda n: train(lab, [n], f"u-{n}", common(a), cwd), ("node0", "node3"))
    slow.limit_cpu(cpus=core, quota=0.5)
    out.append(row("node0 alone (half a core)", one, None).replace("1.00x", "-"))
    out.append(row("node3 alone at a quarter core", quarter, one["tokens_per_s"]).replace("x |", "x one node |"))
    print("\n".join(out), file=sys.stderr, flush=True)
    shape(lab, a.link)
    nodes = [f"node{i}" for i in range(4)]
    timed = ["training.sync=diloco", f"training.diloco.inner_steps={a.inner}", "training.diloco.timed=true"]
    r = train(lab, nodes, "u-four", common(a) + timed, cwd)
    out.append(row(f"4 nodes, diloco, rounds by time (H={a.inner}), {a.link}", r, one["tokens_per_s"])
               .replace("x |", "x one node |"))
    print(out[-1], file=sys.stderr, flush=True)
    ideal = 3 * one["tokens_per_s"] + quarter["tokens_per_s"]
    cap_at = max(1, int(a.steps * a.slow_at))
    for run_id, label, extra in (("u-slow-fixed", f"fixed rounds of H={a.inner}", timed[:2]),
                                 ("u-slow-timed", f"rounds by time (H={a.inner})", timed)):
        metrics = lab.node("node0").home / "hrmctl" / "runs" / run_id / "metrics.jsonl"
        capped = []

        def cap():  # node3 to a quarter core once the run's records reach cap_at
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:
                text = metrics.read_text() if metrics.exists() else ""
                steps = [int(m) for m in re.findall(r'"step": (\d+)', text)]
                if steps and steps[-1] >= cap_at:
                    slow.limit_cpu(cpus=core, quota=0.25)
                    capped.append(steps[-1])
                    print(f"{run_id}: node3 to a quarter core at step {steps[-1]}", file=sys.stderr, flush=True)
                    return
                time.sleep(0.2)

        with ThreadPoolExecutor(1) as pool:
            waiter = pool.submit(cap)
            r = train(lab, nodes, run_id, common(a) + extra, cwd)
            waiter.result()
        slow.limit_cpu(cpus=core, quota=0.5)
        r = figures(lab, nodes, run_id, r["wall_s"], since_step=capped[0] + 1) if capped else r
        out.append(f"| 4 nodes, node3 to a quarter core at step {capped[0] if capped else '-'}, diloco {label}, "
                   f"{a.link}: after the cap | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / ideal:.2f} of the ideal "
                   f"sum ({ideal:.0f}) | {r['val_loss']:.4f} | {r['wall_s']:.0f} s |")
        print(out[-1], file=sys.stderr, flush=True)
    done(lab, out)


def _cores() -> list[int]:
    from lab.nodes import CGROUP_ROOT, _cpu_list
    return _cpu_list((CGROUP_ROOT / "cpuset" / "cpuset.effective_cpus").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("targets", "balance", "table", "compress", "unequal", "defaults"))
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--model", default=None)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--inner", type=int, default=8, help="DiLoCo's H")
    p.add_argument("--overlap", type=int, default=2, help="targets: DiLoCo's overlap_steps in the overlap rows")
    p.add_argument("--modes", default="ceiling,ddp,ddp-bf16,diloco,diloco-overlap,diloco-avg,diloco-avg-overlap",
                   help="targets: which two-node rows to run (ceiling: the two nodes each alone at once)")
    p.add_argument("--links", default="LAN,200M+3ms", help="targets: the links to run the two-node rows on")
    p.add_argument("--link", default="wifi", choices=NAMES, help="compress: the link of the two-node rows")
    p.add_argument("--slow-at", type=float, default=0.3, help="unequal: the part of the run after which node3 slows")
    p.add_argument("--ddp-loss", type=float, default=None,
                   help="targets: DDP's final val loss on the LAN from an earlier run, when ddp is not in --modes")
    a = p.parse_args()
    a.modes, a.links = a.modes.split(","), a.links.split(",")
    a.model = a.model or ("small" if a.what in ("targets", "compress", "defaults") else "mini")
    if a.what == "unequal":  # rounds of a default's length (H=50): long enough that the round's sending is small
        a.steps = a.steps if "--steps" in sys.argv else 240
        a.inner = a.inner if "--inner" in sys.argv else 40
    tmp = Path(tempfile.mkdtemp(prefix="bench-lowcomm-"))
    with Lab({"table": 3, "unequal": 4}.get(a.what, 2)) as lab:
        prepare(lab, tmp)
        print(f"{a.what}: model={a.model}, batch {a.batch} per rank, {a.steps} steps, DiLoCo H={a.inner}",
              file=sys.stderr, flush=True)
        {"targets": targets, "balance": balance, "table": table, "compress": compress,
         "unequal": unequal, "defaults": defaults}[a.what](lab, a, tmp)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
