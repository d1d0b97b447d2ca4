"""`hrmctl top`: the node agent run here for real (with psutil, and without it from /proc), a real trainer
found by it with its step and loss, the view on made-up snapshots (its input), `top --once --json`
through cli.app.main, and the live view in a real pseudo-terminal left with `q`."""

from __future__ import annotations

import fcntl
import json
import math
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from cli.nodes.inventory import Node
from cli.top import view
from cli.top.watch import NodeState
from node.ship import program

GIB = 1024 ** 3


class Agent:
    """The agent as its own process, exactly as a node runs it: `python -u -c program("sampler") --interval S`."""

    def __init__(self, *flags: str, interval: float = 0.2, env: dict | None = None):
        argv = [sys.executable, *flags, "-u", "-c", program("sampler"), "--interval", str(interval)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)

    def lines(self, n: int, timeout: float = 60) -> list[dict]:
        out, deadline = [], time.monotonic() + timeout
        while len(out) < n:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                pytest.fail(f"the agent gave {len(out)} of {n} lines in {timeout:g}s")
            line = self.proc.stdout.readline()
            if not line:
                pytest.fail(f"the agent ended: {self.proc.stderr.read()[-2000:]}")
            out.append(json.loads(line))
        return out

    def close(self) -> int:
        """Close its stdin, as a dropped SSH channel does: the agent must end by itself."""
        self.proc.stdin.close()
        try:
            return self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def check_sane(doc: dict, *, with_psutil: bool) -> None:
    cores = os.cpu_count()
    assert doc["v"] == 1 and doc["cores"] == cores and doc["psutil"] is with_psutil
    assert 0 <= doc["cpu"] <= 100 and 0 <= doc["cpu"] * cores <= 100 * cores
    assert len(doc["per_core"]) == cores and all(0 <= c <= 100 for c in doc["per_core"])
    assert 0 < doc["mem_used"] <= doc["mem_total"]
    assert doc["net_tx"] >= 0 and doc["net_rx"] >= 0
    assert doc["gpus"] is None or isinstance(doc["gpus"], list)  # no NVIDIA driver here: None, with the reason
    assert isinstance(doc["ranks"], list) and abs(doc["t"] - time.time()) < 60


@pytest.mark.parametrize("with_psutil", [True, False], ids=["psutil", "proc"])
def test_agent_prints_sane_lines_and_ends_when_its_stdin_closes(with_psutil):
    # without psutil: `python -S` leaves site-packages (and so psutil) off the path, as on a bare node
    agent = Agent(*([] if with_psutil else ["-S"]))
    try:
        docs = agent.lines(4)
    finally:
        code = agent.close()
    assert code == 0
    for doc in docs:
        check_sane(doc, with_psutil=with_psutil)
    if not with_psutil:
        assert docs[0]["gpu_error"].startswith("no pynvml")
        import psutil
        assert docs[0]["mem_total"] == psutil.virtual_memory().total  # /proc/meminfo, read the same way
    assert docs[0]["agent_cpu"] is None and all(d["agent_cpu"] >= 0 for d in docs[1:])


def test_agent_with_count_prints_that_many_lines_and_ends_cleanly():
    proc = subprocess.Popen([sys.executable, "-u", "-c", program("sampler"), "--interval", "0.1", "--count", "2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.stdout.read(), proc.stderr.read()  # stdin stays open: the agent ends by itself
    assert proc.wait(10) == 0 and err == "" and len(out.splitlines()) == 2, err
    proc.stdin.close()


@pytest.mark.slow
def test_agent_finds_a_running_trainer_with_its_step_and_loss(tmp_path, sudoku_data):
    from tests.trainer.helpers import tiny_args

    data = sudoku_data(300)  # the session's puzzles (read only)
    run = tmp_path / "run"
    own_tmp = tmp_path / "tmp"  # the trainer's TMPDIR: the agent must find the heartbeat from the trainer's own
    own_tmp.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", HRMCTL_RUN_ID="top-unit", TMPDIR=str(own_tmp))
    env.pop("RANK", None)
    errors = open(tmp_path / "trainer.err", "w")  # a file: a pipe nobody reads could stall the trainer
    trainer = subprocess.Popen([sys.executable, "-m", "auralm.training.train",
                                *tiny_args(data, run, "training.max_steps=100000", "training.batch_size=8")],
                               cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=errors)
    agent = None
    try:
        deadline = time.monotonic() + 180
        while not ((run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3):
            if trainer.poll() is not None:
                pytest.fail(f"the trainer ended: {(tmp_path / 'trainer.err').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("the trainer logged no 3 steps in 180 s")
            time.sleep(0.2)
        agent = Agent(interval=0.5)
        docs = agent.lines(3)
        rows = [r for r in docs[-1]["ranks"] if r["pid"] == trainer.pid]
        assert len(rows) == 1, docs[-1]["ranks"]
        [r] = rows
        assert (r["rank"], r["local_rank"], r["world"], r["run"]) == (0, 0, 1, "top-unit")
        assert r["cwd"] == str(tmp_path) and r["out_dir"] == str(run)
        assert r["step"] >= 3 and math.isfinite(r["loss"]) and r["steps_per_s"] > 0 and r["unit"] == "samples"
        assert r["rate"] > 0 and 0 <= r["age"] < 30 and r["cpu"] > 0 and r["rss"] > 0
        logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert r["step"] <= logged[-1]["step"]  # the heartbeat is written right after the log record
        assert (own_tmp / f"hrmctl-top-{os.getuid()}" / f"{trainer.pid}.json").is_file()
        # the rank is this trainer process only: not the agent, not this test's process
        assert all(x["pid"] != os.getpid() for x in docs[-1]["ranks"])
    finally:
        if agent is not None:
            agent.close()
        trainer.terminate()
        errors.close()
        try:
            trainer.wait(20)
        except subprocess.TimeoutExpired:
            trainer.kill()
            trainer.wait()


# ---------------------------------------------------------------- the view, on made-up snapshots

def state(name: str, ranks: list[dict], gpus=None, error=None) -> NodeState:
    data = {"v": 1, "t": time.time(), "host": name, "cores": 4, "cpu": 37.5, "per_core": [30, 40, 45, 35],
            "mem_used": 3 * GIB, "mem_total": 8 * GIB, "net_tx": 1.5e6, "net_rx": 2.5e5, "gpus": gpus,
            "gpu_error": None if gpus else "no pynvml (pip install nvidia-ml-py)", "ranks": ranks,
            "agent_cpu": 0.4, "psutil": True}
    return NodeState(Node(name=name, host=f"10.0.0.{len(name)}", user="aura"), data=data,
                     received=time.monotonic(), error=error, lines=3)


def rank(r: int, step: int, rate: float, loss: float, age: float = 0.4, run: str = "run1") -> dict:
    return {"pid": 1000 + r, "rank": r, "local_rank": 0, "world": 2, "run": run, "cwd": "/w", "out_dir": None,
            "cpu": 180.0, "rss": 900e6, "step": step, "loss": loss, "steps_per_s": rate, "rate": rate * 8,
            "unit": "samples", "age": age}


def text_of(renderable) -> list[str]:
    from rich.console import Console

    console = Console(record=True, width=200, force_terminal=False, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def row(lines: list[str], *words: str) -> str:
    found = [l for l in lines if all(w in l.split() for w in words)]
    assert len(found) == 1, (words, lines)
    return found[0]


def test_view_shows_every_node_and_marks_the_slowest_rank():
    gpu = [{"index": 0, "name": "RTX 3060", "util": 87, "mem_used": 5 * GIB, "mem_total": 12 * GIB}]
    states = [state("node0", [rank(0, 120, 4.0, 1.2345)]), state("node1", [rank(1, 118, 3.1, 1.3)]),
              state("node2", [], gpus=gpu)]
    lines = text_of(view.render(states, interval=1.0))
    assert "◀ slowest" in row(lines, "node1", "r1") and "slowest" not in row(lines, "node0", "r0")
    assert "118" in row(lines, "node1", "r1") and "3.10" in row(lines, "node1", "r1")
    assert "1.2345" in row(lines, "node0", "r0")
    node0 = row(lines, "node0", "10.0.0.5")
    assert "none" in node0.split() and "38%" in node0 and "1.5 MB/s" in node0 and "250 KB/s" in node0
    assert "87%" in row(lines, "node2", "10.0.0.5") and "5.0/12.0G" in row(lines, "node2", "10.0.0.5")
    assert any("slowest of run1: node1 r1, 22.5% below" in l for l in lines)

    doc = view.snapshot_json(states)
    assert [(r["node"], r["rank"], r["slowest"]) for r in doc["ranks"]] == [("node0", 0, False), ("node1", 1, True)]
    assert doc["slowest"] == {"run1": {"node": "node1", "rank": 1, "behind_pct": 22.5}}
    assert [n["name"] for n in doc["nodes"]] == ["node0", "node1", "node2"] and all(n["ok"] for n in doc["nodes"])
    json.dumps(doc)


def test_a_stalled_rank_is_the_slowest_and_a_lone_rank_is_not_marked():
    states = [state("node0", [rank(0, 500, 9.0, 0.9, age=60.0), rank(1, 520, 8.0, 0.8)]),
              state("node1", [rank(0, 40, 2.0, 2.0, run="other")])]
    lines = text_of(view.render(states))
    assert "◀ slowest stalled" in row(lines, "run1", "node0", "r0") and "slowest" not in row(lines, "run1", "node0", "r1")
    assert "slowest" not in row(lines, "other", "node1", "r0")  # one rank alone: nothing to compare
    assert set(view.snapshot_json(states)["slowest"]) == {"run1"}


def test_view_of_a_node_without_answer_and_of_no_job():
    lost = NodeState(Node(name="laptop", host="192.168.1.21", user="aura"), error="laptop: no answer for 12s")
    lines = text_of(view.render([state("node0", []), lost]))
    assert "no answer" in row(lines, "laptop", "192.168.1.21")
    assert "laptop: no answer for 12s" in [l.strip() for l in lines]
    assert "no training job on these nodes" in [l.strip() for l in lines]
    doc = view.snapshot_json([lost])
    assert doc["nodes"][0]["ok"] is False and doc["nodes"][0]["error"] == "laptop: no answer for 12s"


# ---------------------------------------------------------------- the command

def test_once_json_through_main(tmp_path, monkeypatch, capsys):
    from cli.app import main

    monkeypatch.chdir(tmp_path)  # no hrmctl.toml: localhost is this machine, without SSH
    monkeypatch.delenv("HRMCTL_INVENTORY", raising=False)
    code = main(["top", "--nodes", "localhost", "--once", "--json", "--interval", "0.3"])
    out = capsys.readouterr().out
    assert code == 0, out
    doc = json.loads(out)
    [node] = doc["nodes"]
    assert node["name"] == "localhost" and node["ok"] and node["error"] is None
    check_sane(node | {"ranks": []}, with_psutil=True)
    assert isinstance(doc["ranks"], list) and isinstance(doc["slowest"], dict)  # whatever runs here now


def test_bad_interval_is_one_line(tmp_path, monkeypatch, capsys):
    from cli.app import main

    monkeypatch.chdir(tmp_path)
    assert main(["top", "--interval", "0", "--once"]) == 2
    assert capsys.readouterr().err.startswith("error: --interval 0 must be a positive number")


def _controlling_terminal() -> None:
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.parametrize("key", [b"q", b"\x03"], ids=["q", "ctrl-c"])
def test_live_view_in_a_terminal_leaves_on_q_or_ctrl_c_and_restores_the_terminal(tmp_path, key):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    before = termios.tcgetattr(slave)
    env = dict(os.environ, TERM="xterm-256color", COLUMNS="200", LINES="50")
    env.pop("HRMCTL_INVENTORY", None)
    proc = subprocess.Popen([sys.executable, "-m", "cli", "top", "--nodes", "localhost", "--interval", "0.5"],
                            stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env,
                            preexec_fn=_controlling_terminal)  # so that Ctrl-C on it is a SIGINT, as in a shell
    screen = b""

    def drain(seconds: float) -> None:
        nonlocal screen
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    screen += os.read(master, 65536)
                except OSError:
                    return

    try:
        deadline = time.monotonic() + 60
        while not (b"localhost" in screen and b"%" in screen):
            assert proc.poll() is None and time.monotonic() < deadline, screen.decode(errors="replace")[-3000:]
            drain(0.5)
        cbreak = termios.tcgetattr(slave)
        assert not cbreak[3] & termios.ICANON and not cbreak[3] & termios.ECHO  # single keys, no echo
        os.write(master, key)
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 15:
            drain(0.2)
        assert proc.returncode == 0, screen.decode(errors="replace")[-3000:]
        assert time.monotonic() - t0 < 5, "q must leave at once"
        assert b"Traceback" not in screen
        assert termios.tcgetattr(slave) == before  # the terminal is as it was
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


def test_the_bytes_a_rank_sent_for_its_last_round_are_a_column_only_when_a_run_sends_rounds():
    plain = text_of(view.render([state("node0", [rank(0, 120, 4.0, 1.2)])]))
    assert not any("sent/round" in l for l in plain)
    diloco = [state("node0", [dict(rank(0, 120, 4.0, 1.2), round_bytes=105040)]),
              state("node1", [dict(rank(1, 118, 3.1, 1.3), round_bytes=105040)])]
    lines = text_of(view.render(diloco))
    assert any("sent/round" in l for l in lines) and "105 KB" in row(lines, "node1", "r1")
    assert view.snapshot_json(diloco)["ranks"][0]["round_bytes"] == 105040
