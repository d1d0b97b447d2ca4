"""Time from `hrmctl train` to the first training step, against a hand-typed torchrun on the same
two nodes, in the same run (target: hrmctl at most 1 s more).

The peer is what a user types in two terminals: `ssh nodeN '<torchrun line>'`, started at the same
moment on both nodes, with the very command line and environment that `hrmctl train --dry-run`
prints (so both start the same torchrun; the difference is hrmctl: its start-up, the trainer's
--check, the preflight - probes, master port check - and the connections). The data set is made
on the nodes once before timing. "warm" runs use the torch facts cached by an earlier launch;
"cold" runs start with an empty cache (a first launch: torch's answers guessed without torch and
confirmed on each node by node/torchrun.py, with torchrun's own import of torch).

Each lab node is pinned to a core of its own (bench/_handrun.pin_nodes; `--no-pin` to not).
Root only (it makes a lab of 2 real sshd nodes). Usage: python bench/launch_overhead.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _handrun import Lab, hrmctl, pin_nodes, planned_commands, ssh_popen  # noqa: E402

TRAIN = ["model=tiny", "training.max_steps=3", "training.batch_size=8", "training.log_interval=1",
         "training.checkpoint_interval=0", "training.eval_interval=0", "training.eval_batches=1"]


PREFLIGHT: list[float] = []  # hrmctl's own part: from its start to "hrmctl run ..." (jobs start right after)


def until_first_step(stream, marks: dict | None = None) -> float | None:
    for line in stream:
        if marks is not None and line.startswith("hrmctl run ") and "launched" not in marks:
            marks["launched"] = time.perf_counter()
        if "step 1/" in line:
            return time.perf_counter()
    return None


def time_hrmctl(lab: Lab, cwd: Path, run_id: str, port: int, extra_env=None) -> float:
    t0 = time.perf_counter()
    proc = hrmctl(lab, "train", "--nodes", "node0,node1", "--run-id", run_id, "--master-port", str(port), *TRAIN,
                  cwd=cwd, popen=True, extra_env=extra_env)
    marks: dict = {}
    t1 = until_first_step(proc.stdout, marks)
    _, err = proc.communicate()
    if t1 is None or proc.returncode != 0:
        raise SystemExit(f"hrmctl train failed ({proc.returncode}): {err[-800:]}")
    if "launched" in marks and extra_env is None:
        PREFLIGHT.append(marks["launched"] - t0)
    return t1 - t0


def time_by_hand(lab: Lab, cwd: Path, run_id: str, port: int) -> float:
    lines = planned_commands(lab, "train", ["--nodes", "node0,node1", "--run-id", run_id, "--master-port", str(port),
                                            *TRAIN], cwd)
    t0 = time.perf_counter()
    procs = {name: ssh_popen(lab, name, line) for name, line in lines.items()}
    t1 = until_first_step(procs["node0"].stdout)
    outs = {name: p.communicate()[0] for name, p in procs.items()}
    if t1 is None or any(p.returncode for p in procs.values()):
        raise SystemExit(f"hand-typed torchrun failed: {[p.returncode for p in procs.values()]}: "
                         + " | ".join(f"{n}: {o[-600:]}" for n, o in outs.items()))
    return t1 - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-pin", action="store_true", help="let both lab nodes use every core")
    args = ap.parse_args()
    lab = Lab(2).up()
    if not args.no_pin:
        pin_nodes(lab)
    try:
        cwd = Path(tempfile.mkdtemp(prefix="bench-launch-"))
        time_hrmctl(lab, cwd, "warmup", 29650)  # makes the data on both nodes and fills the facts cache
        ours, hand, cold = [], [], []
        for i in range(args.repeat):  # interleaved, so that the machine's load hits all alike
            ours.append(time_hrmctl(lab, cwd, f"h{i}", 29660 + i))
            hand.append(time_by_hand(lab, cwd, f"m{i}", 29670 + i))
            cold.append(time_hrmctl(lab, cwd, f"c{i}", 29680 + i, extra_env={"HRMCTL_CACHE": tempfile.mkdtemp()}))
        print(f"time to first training step, 2 namespace nodes, {args.repeat} runs each (median, min):")
        print(f"  hand-typed torchrun (ssh x2)  {statistics.median(hand):6.2f} s  {min(hand):6.2f} s")
        print(f"  hrmctl train (warm cache)     {statistics.median(ours):6.2f} s  {min(ours):6.2f} s")
        print(f"  hrmctl train (cold cache)     {statistics.median(cold):6.2f} s  {min(cold):6.2f} s")
        print(f"  hrmctl's own start + preflight (process start -> jobs started, warm): median "
              f"{statistics.median(PREFLIGHT[1:]):.2f} s, min {min(PREFLIGHT[1:]):.2f} s")
        for kind, runs in (("warm", ours), ("cold", cold)):
            extra = statistics.median(runs) - statistics.median(hand)
            print(f"  hrmctl overhead ({kind}, median): {extra:+.2f} s  (target: at most +1.00 s) "
                  f"{'OK' if extra <= 1.0 else 'MISSED'}")
        return 0
    finally:
        lab.down()


if __name__ == "__main__":
    sys.exit(main())
