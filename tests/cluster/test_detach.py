"""`hrmctl train --detach`, `hrmctl attach`, `hrmctl stop`, typed on a lab node acting as the master, over real SSH
sessions to it (paramiko, a PTY as a terminal has): node0's user runs hrmctl (lab.nodes.ensure_cli_venv) with the
lab's key and an inventory of node0 and node1 in its home, and the run trains on both nodes.

One run is detached from a PTY session that is then closed (sshd hangs the session up), and finishes: `attach`
follows it to the end with its exit code, and nothing of it is left on any node. A second, long one shows as running
in `hrmctl runs`, an `attach` on a PTY is left with Ctrl-C (the run goes on), and `hrmctl stop` ends it on every node
with nothing left.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import paramiko
import pytest

from lab.nodes import ensure_cli_venv
from tests.cluster.test_stop_paths import local_run_processes
from tests.polling import wait_for

ARGS = ["task=lm", "data_dir=~/hrmctl/data/quijote", "model=tiny", "training.batch_size=8", "training.log_interval=1",
        "training.eval_interval=0", "training.checkpoint_interval=0", "logging.curves=false"]


class Master:
    """node0 as the machine the user types on: SSH sessions to it run hrmctl in ~/hrmctl."""

    def __init__(self, lab, python: Path):
        self.lab, self.node, self.python = lab, lab.nodes[0], python

    def client(self) -> paramiko.SSHClient:
        c = paramiko.SSHClient()
        c.load_host_keys(str(self.lab.known_hosts))
        c.set_missing_host_key_policy(paramiko.RejectPolicy())
        c.connect(self.node.ip, username=self.node.user, key_filename=str(self.lab.key), look_for_keys=False,
                  allow_agent=False, timeout=10)
        return c

    def line(self, *args: str) -> str:
        return (f"cd ~/hrmctl && HRMCTL_INVENTORY=~/lab.toml exec {self.python} -m cli "
                + " ".join(args) + " 2>&1")

    def run(self, *args: str, timeout: float = 300, pty: bool = False) -> tuple[int, str]:
        """hrmctl ARGS in a session of its own, which is closed when it returns: (exit code, output)."""
        c = self.client()
        try:
            chan = c.get_transport().open_session()
            if pty:
                chan.get_pty()
            chan.settimeout(timeout)
            chan.exec_command(self.line(*args))
            out = b""
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                out += data
            return chan.recv_exit_status(), out.decode(errors="replace")
        finally:
            c.close()  # the session ends: sshd hangs up what it started on the PTY

    def status(self, run_id: str) -> dict:
        try:
            return json.loads((self.node.home / "hrmctl" / "runs" / run_id / "status.json").read_text())
        except (OSError, ValueError):
            return {}


@pytest.fixture(scope="module")
def master(lab3, text_on_nodes):
    python = ensure_cli_venv()
    node = lab3.nodes[0]
    ssh = node.home / ".ssh"
    made = [ssh / "id_lab", ssh / "known_hosts_lab", node.home / "lab.toml"]
    shutil.copy(lab3.key, made[0])
    made[0].chmod(0o600)
    shutil.copy(lab3.known_hosts, made[1])
    made[2].write_text(lab3.inventory.read_text().replace(str(lab3.key), str(made[0]))
                       .replace(str(lab3.known_hosts), str(made[1])))
    for p in made:
        shutil.chown(p, node.user, node.user)
    yield Master(lab3, python)
    for p in made:
        p.unlink(missing_ok=True)
    shutil.rmtree(node.home / "hrmctl" / "runs", ignore_errors=True)


def test_a_detached_run_outlives_its_ssh_session_and_attach_follows_it_to_the_end(master):
    run_id = "detach-finish"
    t0 = time.monotonic()
    code, out = master.run("train", "--detach", "--nodes", "node0,node1", "--run-id", run_id,
                           "training.max_steps=12", *ARGS, pty=True)
    assert code == 0, out
    assert f"run {run_id}: running detached" in out and f"hrmctl attach {run_id}" in out \
        and f"hrmctl stop {run_id}" in out, out
    assert master.status(run_id)["state"] == "running", out
    print(f"detach returned after {time.monotonic() - t0:.1f}s")
    # the session that started it is closed: the run goes on, attach follows it to the end
    code, out = master.run("attach", run_id, timeout=240)
    status = master.status(run_id)
    assert code == 0 and status["state"] == "finished" and status["exit_code"] == 0, (out, status)
    assert "step 12/12" in out and out.splitlines()[-1] == f"run {run_id} finished: every node finished (exit code 0)", out
    assert status["detached"] is True and status["first_step"] > status["started"], status
    assert local_run_processes(run_id) == [], "processes of the run left behind"


def test_attach_ctrl_c_leaves_the_run_going_and_stop_ends_it_on_every_node(master):
    run_id = "detach-stop"
    code, out = master.run("train", "--detach", "--nodes", "node0,node1", "--run-id", run_id,
                           "training.max_steps=3000", "fault.step_sleep=0.1", *ARGS)  # paced: waits for the stop
    assert code == 0, out
    code, out = master.run("runs", "--json")
    assert code == 0 and next(r for r in json.loads(out) if r["id"] == run_id)["status"] == "running", out
    # attach on a terminal, then Ctrl-C: detached, the run goes on
    c = master.client()
    try:
        chan = c.get_transport().open_session()
        chan.get_pty()
        chan.exec_command(master.line("attach", run_id, "--lines", "2"))
        seen = b""

        def step_shown():
            nonlocal seen
            while chan.recv_ready():
                seen += chan.recv(65536)
            return b"[rank0]:step " in seen
        wait_for(step_shown, 60, "a step line from attach", show=lambda: seen.decode(errors="replace"))
        chan.send(b"\x03")
        code = chan.recv_exit_status()
        while chan.recv_ready():
            seen += chan.recv(65536)
    finally:
        c.close()
    assert code == 0 and b"detached from run" in seen, seen.decode(errors="replace")
    assert master.status(run_id)["state"] == "running", "Ctrl-C of attach stopped the run"
    assert local_run_processes(run_id), "the run is not running after attach's Ctrl-C"
    t0 = time.monotonic()
    code, out = master.run("stop", run_id, timeout=120)
    took = time.monotonic() - t0
    assert code == 0 and f"run {run_id} stopped: every node stopped" in out, out
    assert local_run_processes(run_id) == [], "processes of the run left after hrmctl stop returned"
    status = master.status(run_id)
    assert status["state"] == "stopped" and status["exit_code"] == 143, status
    assert took < 30, f"hrmctl stop took {took:.1f}s"
