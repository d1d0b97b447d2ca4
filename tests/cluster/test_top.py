"""`hrmctl top` on real sshd nodes during a two-node `hrmctl train`: `--once --json`, then the live view in a
real terminal (tmux), with both nodes and both ranks on the screen, left with `q`; meanwhile the agent's own
CPU time on each node is measured from /proc (its CPU time / wall time)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.polling import wait_for

IN_CI = os.environ.get("CI", "").lower() == "true"

MARK = b"# hrmctl-node sampler"  # the first line of the sampler's bootstrap (node/ship.py), its command line (-c)
TRAIN = ["model=tiny", "training.max_steps=100000", "training.batch_size=8", "training.log_interval=2",
         "training.eval_interval=0", "training.checkpoint_interval=0",
         "fault.step_sleep=0.1"]  # about 8 steps a second, enough for top to read: unpaced, the two ranks took both
# cores for the whole test (this test alone, its lab's set-up included: 37 CPU-s unpaced, 19 paced, 24 s either way)


def agent_pids(lab_node) -> list[int]:
    """The top agents running as the node's user (seen from here: one pid namespace for all nodes)."""
    uid = pwd.getpwnam(lab_node.user).pw_uid
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if MARK in fh.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


class Tmux:
    """A tmux server of our own (its own socket), whose pane stays after its process ends (to read the last screen).
    tmux 3.3 leaves #{pane_dead_status} empty when the pane runs one program directly, so the pane's shell
    writes hrmctl's exit code to a file."""

    def __init__(self, tmp_path):
        self.sock = f"hrmtop{os.getpid()}"
        self.conf = tmp_path / "tmux.conf"
        self.conf.write_text("set -g remain-on-exit on\nset -g history-limit 100\n")

    def __call__(self, *args: str, check: bool = True) -> str:
        res = subprocess.run(["tmux", "-L", self.sock, "-f", str(self.conf), *args], capture_output=True, text=True,
                             timeout=30)
        if check and res.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {res.stderr}")
        return res.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "top")

    def dead(self) -> bool:
        return self("display-message", "-p", "-t", "top", "#{pane_dead}").strip() == "1"

    def kill(self) -> None:
        self("kill-server", check=False)


@pytest.mark.skipif(shutil.which("tmux") is None and not IN_CI, reason="tmux is not installed (apt-get install tmux)")
def test_top_during_a_two_node_run_in_a_real_terminal(lab3, hrmctl, tmp_path):
    if shutil.which("tmux") is None:  # on CI, where the skip above does not apply
        pytest.fail("tmux is missing (apt-get install tmux; .ci/run installs it)")
    node0, node1, node2 = lab3.nodes
    env = dict(os.environ, HRMCTL_INVENTORY=str(lab3.inventory))
    with open(tmp_path / "train.out", "w") as train_out:  # a file, never a pipe nobody reads
        train = subprocess.Popen([sys.executable, "-m", "cli", "train", "--nodes", "node0,node1", "--run-id", "top2",
                                  *TRAIN], cwd=tmp_path, env=env, stdout=train_out, stderr=subprocess.STDOUT)
    tmux = Tmux(tmp_path)
    try:
        log = tmp_path / "runs" / "top2" / "node0.log"

        def stepping():
            if train.poll() is not None:
                pytest.fail(f"hrmctl train ended: {(tmp_path / 'train.out').read_text()[-3000:]}")
            return log.exists() and log.read_text().count("[rank0]:step ") >= 2
        wait_for(stepping, 240, "the first training steps")

        def top_once(nodes: str) -> dict:
            code, out, err = hrmctl("top", "--nodes", nodes, "--once", "--json", inventory=lab3.inventory, timeout=90)
            assert code == 0, out + err
            return json.loads(out)

        # --once --json: both ranks of the run, each on its own node, with step and loss; none on node2
        def both_ranks():
            doc = top_once("node0,node1,node2")
            ranks = [r for r in doc["ranks"] if r["run"] == "top2"]
            return doc if len(ranks) == 2 and all(r["step"] is not None for r in ranks) else None
        doc = wait_for(both_ranks, 60, "both ranks' heartbeats")
        assert [(n["name"], n["host"], n["ok"]) for n in doc["nodes"]] == [
            ("node0", "node0", True), ("node1", "node1", True), ("node2", "node2", True)]
        for n in doc["nodes"]:
            assert n["gpus"] is None and n["psutil"] is True and 0 <= n["cpu"] <= 100
            assert 0 < n["mem_used"] <= n["mem_total"] and n["net_tx"] >= 0 and n["net_rx"] >= 0
        ranks = {(r["node"], r["rank"]): r for r in doc["ranks"]}
        assert set(ranks) == {("node0", 0), ("node1", 1)}  # node2 sees the other users' trainers, reports none
        for r in ranks.values():
            assert r["world"] == 2 and r["run"] == "top2" and r["steps_per_s"] > 0 and r["loss"] > 0
        assert set(doc["slowest"]) == {"top2"} and sum(r["slowest"] for r in ranks.values()) == 1
        # every node's traffic: the two ranks exchange gradients. One --once reading is a rate over the agent's
        # first half second, which can fall between two exchanges when a step takes longer (a loaded CI
        # machine: node1 read 0 B/s once), so it is read until a window holds one
        def traffic():
            nodes = top_once("node0,node1")["nodes"]
            return nodes[0]["net_tx"] > 0 and nodes[1]["net_rx"] > 0
        wait_for(traffic, 60, "gradient traffic between node0 and node1")

        # the live view in a terminal of 200 x 50
        exit_file = tmp_path / "top.exit"
        command = (f"env -u COLUMNS -u LINES HRMCTL_INVENTORY={lab3.inventory} {sys.executable} -m cli top --nodes node0,node1; "
                   f"echo $? > {exit_file}")
        tmux("new-session", "-d", "-s", "top", "-x", "200", "-y", "50", "-c", str(tmp_path), command)

        last = {}

        def on_screen():
            text = last["screen"] = tmux.screen()
            if tmux.dead():
                pytest.fail(f"hrmctl top ended by itself:\n{text}")
            lines = text.splitlines()
            nodes = all(any(re.search(rf"\b{n}\s+{re.escape(ip)}\s+\d+%", l) for l in lines)
                        for n, ip in (("node0", node0.ip), ("node1", node1.ip)))
            ranks = all(any(re.search(rf"\btop2\s+{n}\s+r{r}\s+\d+\s+\d+\.\d+\s+\d+\.\d+", l) for l in lines)
                        for n, r in (("node0", 0), ("node1", 1)))
            return text if nodes and ranks and "◀ slowest" in text else None
        screen = wait_for(on_screen, 60, "both nodes and both ranks on the screen", lambda: last.get("screen"))
        print("\n" + screen)
        assert "Traceback" not in screen

        # the agent's own cost on each node: its CPU time over 10 s of wall time, read from /proc
        cost = {}
        for n in (node0, node1):
            wait_for(lambda: len(agent_pids(n)) == 1, 20, f"one top agent on {n.name}")  # --once's ones are gone
        pids = {n.name: agent_pids(n)[0] for n in (node0, node1)}
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        t0 = time.monotonic()
        time.sleep(10)
        wall = time.monotonic() - t0
        for name, pid in pids.items():
            cost[name] = 100 * (cpu_seconds(pid) - before[name]) / wall
        print(f"\ntop agent CPU on the node (its CPU time / wall time over {wall:.1f}s): "
              + ", ".join(f"{k} {v:.2f}%" for k, v in cost.items()))
        assert all(v < 2.0 for v in cost.values()), cost
        assert tmux.screen().count("r0") >= 1  # still live

        # q leaves: the pane's process exits 0, and the channels close, so the agents end on the nodes
        tmux("send-keys", "-t", "top", "q")
        wait_for(tmux.dead, 15, "hrmctl top to leave on q", tmux.screen)
        assert exit_file.read_text().strip() == "0", tmux.screen()
        for n in (node0, node1):
            wait_for(lambda: agent_pids(n) == [], 15, f"the agent on {n.name} to end")
        assert train.poll() is None, "the training run goes on"
    finally:
        tmux.kill()
        if train.poll() is None:
            train.send_signal(signal.SIGINT)
            try:
                train.wait(60)
            except subprocess.TimeoutExpired:
                train.kill()
                train.wait()
