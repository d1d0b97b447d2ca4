"""A node lost during a two-node DDP (or DiLoCo: --sync diloco) run, and back later: hrmctl's leave and rejoin (`training.elastic.min_nodes=1`,
cli/launch/supervise/elastic.py) side by side with torchrun's own elastic mode (`--nnodes=1:2 --rdzv-backend=c10d
--max-restarts=5`, started by hand on each node), on the same lab nodes, with the same run and the same fault, made
right after the run's checkpoint at step 50 (FAULTS):

  link   every packet in and out of node1 dropped for 30 s (iptables);
  sleep  every process of node1's namespace, sshd too, stopped for 60 s (SIGSTOP, then SIGCONT: LabNode.freeze);
  kill   every process of node1's user killed (SIGKILL); nothing starts them again but hrmctl's rejoin.

Per side: the seconds from the fault until rank 0 steps again after its steps stalled, and the steps lost (the
last step rank 0 logged before the stall, minus the step it resumed from; 0 when it went on without a restart,
its collective having waited for node1); then, if the world was restarted without node1, the seconds from the
node's return (link back, woken; for kill the fault itself) until rank 0 steps again after the next stall (node1
back in the world), and the steps lost then.

Both run the trainer with dist_timeout=DIST_TIMEOUT_S (60 s; the default is 300 s) so that torchrun's side ends
within minutes: its agents learn of the loss only when a collective times out. hrmctl's does not wait for that (SSH
heartbeats). Each line's time is when this script read it.

Under DiLoCo (H=10 local steps a round, SYNC) rank 0 steps on through a fault until its round's end, where the
all-reduce waits for node1; "steps again" is read the same way.

Root only. Usage: python bench/elastic.py [--side hrmctl|torchrun] [--fault link,sleep,kill] [--sync ddp|diloco]
[--link LAN|wifi|...] (both sides, every fault, DDP on the lab's LAN by default: about 15 minutes). ``--link wifi``
shapes both nodes' links as a crowded 2.4 GHz Wi-Fi (lab/links.py: 50 Mbit/s, 5 +- 2.5 ms, 1% loss) for both sides.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab.links import NAMES, said, shape  # noqa: E402
from lab.nodes import Lab, sh  # noqa: E402

FAULTS = {"link": 30, "sleep": 60, "kill": 0}  # seconds until the node is back
REJOIN_WAIT_S = 150  # after the node is back: how long a side may take to step with it again
GAP_S = 20.0  # a step line this long after the one before, with no resume between: the run stalled and went on
DIST_TIMEOUT_S = 60
THREADS = 1  # a rank's threads, both sides: the lab's two nodes share this machine's 2 cores, and 2 threads a rank (4
# on 2 cores) made the first round after a restart take 0.65-8.35 s over 8 runs of the sleep rejoin, both ranks alike;
# 0.22-0.31 s with 1 (2026-11-28, docs/elastic.md)
EVERY = 50
TRAIN = ["model=tiny", "training.max_steps=100000", "training.batch_size=8", "training.log_interval=10",
         f"training.checkpoint_interval={EVERY}", "training.eval_interval=0", "training.eval_batches=1",
         f"dist_timeout={DIST_TIMEOUT_S}"]  # the data: each node's default, ~/hrmctl/data/sudoku
SYNC = {"ddp": [], "diloco": ["training.sync=diloco", "training.diloco.inner_steps=10"]}  # EVERY: whole rounds
STEP = re.compile(r"step (\d+)/")
RESUMED = re.compile(r"resuming from \S+ \(step (\d+)\)|no checkpoint found: starting fresh")
ONWARD = re.compile(r"left the run \(silent")  # DiLoCo under hrmctl: rank 0 goes on without node1, not restarted


class Lines(threading.Thread):
    """(time read, line) of a process's output."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.lines = stream, []

    def run(self) -> None:
        for line in self.stream:
            self.lines.append((time.time(), line.rstrip("\n")))


def steps(lines: list[tuple[float, str]]) -> list[tuple[float, int]]:
    return [(t, int(m.group(1))) for t, line in lines if (m := STEP.search(line))]


def recovery(lines, after: float, timeout: float) -> tuple[float | None, int | None, bool]:
    """(seconds from ``after`` until rank 0 steps again, steps lost, whether node1 left its world) or (None, None,
    False). Stepping again: the first step after the first resume since ``after``, the steps lost the last step
    logged before that resume minus the step resumed from; or the first step after rank 0 said it goes on without
    node1 in the same process (DiLoCo under hrmctl: 0 lost); or, with neither, a step that came GAP_S or more after
    the one before it (the run went on where it was, its collective having waited for the node: 0 lost).
    ``lines()``: rank 0's lines so far, wherever it runs."""
    deadline = after + timeout
    while time.time() < deadline:
        seen = lines()
        logged = steps(seen)
        resumes = [(t, m) for t, line in seen if t > after and (m := RESUMED.search(line))]
        onward = [t for t, line in seen if t > after and ONWARD.search(line)]
        last = max([t for t, _ in logged if t <= after], default=after)
        for t, _ in [(t, s) for t, s in logged if t > after]:
            if onward and onward[0] < t and not (resumes and resumes[0][0] < onward[0]):
                return t - after, 0, True
            if resumes and resumes[0][0] < t:
                at = int(resumes[0][1].group(1)) if resumes[0][1].group(1) else 0
                before = [s for u, s in logged if u <= resumes[0][0]]
                return t - after, (max(before) - at) if before else None, True
            if t - last > GAP_S:
                return t - after, 0, False
            last = t
        time.sleep(0.2)
    return None, None, False


def make_fault(victim, kind: str):
    """Make the fault on node1; what undoes it (the node back)."""
    if kind == "link":
        rules = [["INPUT", "-j", "DROP"], ["OUTPUT", "-j", "DROP"]]
        for r in rules:
            victim.netns(["iptables", "-I", *r])
        return lambda: [victim.netns(["iptables", "-D", *r], check=False) for r in rules]
    if kind == "sleep":
        victim.freeze(True)
        return lambda: victim.freeze(False)
    sh(["pkill", "-KILL", "-u", victim.user], check=False)
    return lambda: None


def fault_and_back(lab: Lab, lines, saved, kind: str) -> dict:
    wait_until(saved, 300, "the checkpoint at step 50")
    fault = time.time()
    undo, back = make_fault(lab.nodes[1], kind), []
    # the node is back FAULTS[kind] seconds after the fault, however long the survivors take
    timer = threading.Timer(FAULTS[kind], lambda: (undo(), back.append(time.time())))
    timer.start()
    try:
        survive, lost, restarted = recovery(lines, fault, FAULTS[kind] + DIST_TIMEOUT_S + 120)
        timer.join()
    finally:
        timer.cancel()
        if not back:
            undo()
    back = fault if kind == "kill" else back[0]
    if survive is not None and not restarted:  # node1 never left: the world waited for it
        return {"survivors_step_s": survive, "lost_steps": lost, "restarted": False}
    look = max(back, fault + (survive or 0) + 0.01)  # the rejoin is a stall after the survivors' own
    rejoin, lost_join, _ = recovery(lines, look, REJOIN_WAIT_S)
    rejoin = None if rejoin is None else rejoin + look - back
    return {"survivors_step_s": survive, "lost_steps": lost, "restarted": survive is not None,
            "rejoined_step_s": rejoin, "lost_at_join": lost_join}


def wait_until(cond, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise SystemExit(f"no {what} after {timeout:.0f}s")
        time.sleep(0.3)


def hrmctl_side(lab: Lab, work: Path, kind: str, sync: list[str]) -> dict:
    env = dict(os.environ, HRMCTL_INVENTORY=str(lab.inventory))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    run = f"el-{kind}" + ("-diloco" if sync else "")
    proc = subprocess.Popen([sys.executable, "-m", "cli", "train", "--nodes", "node0,node1", "--run-id", run,
                             *TRAIN, *sync, "training.elastic.min_nodes=1"], cwd=work, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = Lines(proc.stdout)
    lines.start()
    try:
        return fault_and_back(lab, lambda: [(t, line) for t, line in list(lines.lines) if " r0 " in line[:12]],
                              lambda: (lab.node("node0").home / "hrmctl" / "runs" / run / f"checkpoint-{EVERY}").is_dir(),
                              kind)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)


def torchrun_side(lab: Lab, kind: str, sync: list[str]) -> dict:
    ip0 = lab.nodes[0].ip
    procs, readers = [], []
    for i, node in enumerate(lab.nodes):  # is_host: the store on node0 (the lab's nodes share one hostname)
        cmd = (f"cd {node.home}/hrmctl && exec env OMP_NUM_THREADS={THREADS} PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=eth0 "
               f"HRMCTL_BACKEND=gloo {lab.python} -m torch.distributed.run --nnodes=1:2 --nproc-per-node=1 "
               f"--rdzv-backend=c10d --rdzv-endpoint={ip0}:29500 --rdzv-conf=is_host={int(i == 0)} --local-addr={node.ip} "
               f"--rdzv-id=bench --max-restarts=5 "
               f"--monitor-interval=1 -m auralm.training.train {shlex.join(TRAIN + sync)} data_dir=data/sudoku "
               f"out_dir=runs/tre-{kind}{'-diloco' if sync else ''} "
               "resume=latest")
        p = subprocess.Popen(["ip", "netns", "exec", node.ns, "runuser", "-u", node.user, "--", "sh", "-c", cmd],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        r = Lines(p.stdout)
        r.start()
        procs.append(p)
        readers.append(r)
    try:
        # only rank 0 logs: its lines come from whichever node holds it
        return fault_and_back(lab, lambda: sorted(list(readers[0].lines) + list(readers[1].lines)),
                              lambda: any((n.home / "hrmctl" / "runs" / f"tre-{kind}{'-diloco' if sync else ''}" /
                                           f"checkpoint-{EVERY}").is_dir()
                                          for n in lab.nodes), kind)  # rank 0 is where the rendezvous put it
    except SystemExit:
        for node, r in zip(lab.nodes, readers):
            print(f"--- {node.name}'s torchrun, its last lines:\n" + "\n".join(line for _, line in r.lines[-25:]))
        raise
    finally:
        for node in lab.nodes:
            sh(["pkill", "-KILL", "-u", node.user], check=False)
        for p in procs:  # ip netns exec and runuser run as root: the user's pkill may leave them waiting
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=30)


def main() -> int:
    from auralm.data.datadir import SUDOKU_DEFAULTS, prepare_sudoku

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", choices=("hrmctl", "torchrun"), help="one side only (default: both)")
    ap.add_argument("--fault", default=",".join(FAULTS), help="comma-separated, of: " + ", ".join(FAULTS))
    ap.add_argument("--sync", choices=tuple(SYNC), default="ddp", help="the run's training.sync (default: ddp)")
    ap.add_argument("--link", choices=NAMES, default="LAN", help="each node's link, both sides (default: the lab's LAN)")
    args = ap.parse_args()
    kinds = [k.strip() for k in args.fault.split(",")]
    if any(k not in FAULTS for k in kinds):
        ap.error(f"--fault {args.fault}: each one of {', '.join(FAULTS)}")
    fmt = lambda v: "never" if v is None else f"{v:.1f} s"  # noqa: E731
    with Lab(2, threads=THREADS) as lab, tempfile.TemporaryDirectory() as tmp:
        made = Path(tmp) / "sudoku"
        prepare_sudoku(made, **dict(SUDOKU_DEFAULTS, test=200))
        lab.give_data(made, "sudoku")
        shape(lab, args.link)
        print(f"training.sync={args.sync}; link {said(args.link)}; faults made on node1 after the checkpoint at step "
              f"{EVERY}; dist_timeout={DIST_TIMEOUT_S}", flush=True)
        for kind in kinds:
            for name, side in (("hrmctl", hrmctl_side), ("torchrun elastic", torchrun_side)):
                if args.side and not name.startswith(args.side):
                    continue
                sync = SYNC[args.sync]
                r = side(lab, Path(tmp), kind, sync) if name == "hrmctl" else side(lab, kind, sync)
                back = "at once" if kind == "kill" else f"after {FAULTS[kind]} s"
                head = f"{kind:5s} {name:17s} fault -> rank 0 steps again {fmt(r['survivors_step_s'])}"
                if r["survivors_step_s"] is not None and not r["restarted"]:
                    print(f"{head} without a restart (its collective waited for node1, back {back}), steps lost 0; "
                          "node1 never left", flush=True)
                    continue
                print(f"{head}, steps lost {r['lost_steps']}; node1 back ({back}) -> rank 0 steps with it after the "
                      f"next resume {fmt(r['rejoined_step_s'])}, steps lost {r['lost_at_join']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
