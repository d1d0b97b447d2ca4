"""`hrmctl runs`, `hrmctl logs`, `hrmctl plot` and each run's curves.png (issue #18, items 2 and 4).

The finished runs are real: short trainings of the trainer (`auralm.training.train.main`) on a small sudoku set; the
failed,
stopped, running and unknown ones are made by hand, as the launcher and a trainer would have left them.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli.app import main
from tests.trainer.helpers import tiny_args

A = "20261101-100000-aaaa"  # real training, model=tiny
B = "20261101-110000-bbbb"  # real training, model=trm-tiny
FAILED = "20261102-090000-f41d"
STOPPED = "20261102-100000-5709"
GONE = "20261102-110000-9011"  # status.json says running, but its launcher is gone
LIVE = "20261102-120000-11fe"  # status.json says running, and its launcher (this test process) lives
UNKNOWN = "20261102-130000-0000"  # no status.json, the metrics stop early, written long ago
OLD = time.time() - 3 * 3600


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def _train(data: Path, out: Path, *extra: str) -> None:
    from auralm.training import train

    assert train.main(tiny_args(data, out, "training.max_steps=12", "training.eval_interval=6",
                                "training.log_interval=2", "logging.curves=true", *extra)) == 0  # the picture too


def _hand_made(run: Path, cfg: dict, *, status: dict | None, steps: int, logs: dict[str, list[str]] | None = None,
               mtime: float | None = OLD) -> None:
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(cfg))
    with open(run / "metrics.jsonl", "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps({"step": s, "loss": 2.0 / s, "lr": 1e-3, "train_s": s * 0.5, "samples_per_s": 32.0})
                    + "\n")
    if status is not None:
        (run / "status.json").write_text(json.dumps(status))
    for node, lines in (logs or {}).items():
        (run / f"{node}.log").write_text("\n".join(lines) + "\n")
    if mtime is not None:
        for p in run.iterdir():
            os.utime(p, (mtime, mtime))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, sudoku_data) -> Path:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("runs-home")
    data = sudoku_data(300)  # the session's puzzles (read only)
    runs = root / "runs"
    try:
        _train(data, runs / A, "model=tiny")
        _train(data, runs / B, "model=trm-tiny", "training.lr=3e-3")
    finally:
        torch.set_num_threads(threads)
    cfg = json.loads((runs / A / "config.json").read_text())
    cfg["training"]["max_steps"] = 100
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import psutil

    me = psutil.Process()
    _hand_made(runs / FAILED, cfg, steps=5, status={
        "run_id": FAILED, "state": "failed", "started": OLD, "ended": OLD + 65, "host": "elsewhere", "pid": 1,
        "module": "auralm.training.train", "nodes": ["node0", "node1"], "world": 2, "exit_code": 1,
        "reason": "rank 1 on node1 failed first (exit code 1)"}, logs={
        "node0": ["# hrmctl launch, attempt 1, node node0 (node rank 0, ranks 0-0), host 10.0.0.1",
                  "09:00:01.000 [rank0]:model tiny (sudoku): 0.1M parameters",
                  "09:00:03.000 [rank0]:step 2/100 | loss 1.0",
                  "09:00:05.000 [rank0]:error: rank 0: Connection closed by peer",
                  "# hrmctl: rank 1 on node1 failed first (exit code 1): stopping the job on every node"],
        "node1": ["# hrmctl launch, attempt 1, node node1 (node rank 1, ranks 1-1), host 10.0.0.2",
                  "09:00:02.000 [rank1]:loading data",
                  "09:00:04.000 [rank1]:Traceback (most recent call last):",
                  "09:00:04.500 [rank1]:RuntimeError: out of patience"]})
    _hand_made(runs / STOPPED, cfg, steps=7, status={
        "run_id": STOPPED, "state": "stopped", "started": OLD, "ended": OLD + 30, "host": socket.gethostname(),
        "pid": dead.pid, "module": "auralm.train", "nodes": ["localhost"], "world": 1, "exit_code": 130,  # pre-rooms
        "reason": "interrupted (Ctrl-C)"})
    _hand_made(runs / GONE, cfg, steps=9, status={
        "run_id": GONE, "state": "running", "started": OLD, "host": socket.gethostname(), "pid": dead.pid,
        "pid_started": OLD, "module": "auralm.training.train", "nodes": ["localhost"], "world": 1})
    _hand_made(runs / LIVE, cfg, steps=3, status={
        "run_id": LIVE, "state": "running", "started": time.time() - 20, "host": socket.gethostname(),
        "pid": os.getpid(), "pid_started": me.create_time(), "module": "auralm.training.train", "nodes": ["localhost"],
        "world": 1}, logs={"localhost": ["12:00:00.000 [rank0]:step 1/100 | loss 2.0"]}, mtime=None)
    _hand_made(runs / UNKNOWN, cfg, steps=4, status=None)
    (runs / "notes").mkdir()  # not a run: nothing a launch or a training leaves
    return runs


def _json_runs(runs: Path, capsys) -> dict[str, dict]:
    capsys.readouterr()
    assert main(["runs", "--json", "--dir", str(runs)]) == 0
    return {r["id"]: r for r in json.loads(capsys.readouterr().out)}


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_runs_json_fields_and_statuses(runs, capsys):
    got = _json_runs(runs, capsys)
    assert set(got) == {A, B, FAILED, STOPPED, GONE, LIVE, UNKNOWN}
    assert list(got)[0] == LIVE  # the newest first
    for r in got.values():
        assert set(r) >= {"id", "start", "duration_s", "nodes", "task", "model", "status", "reason", "steps",
                          "max_steps", "best_val_loss", "best_exact_accuracy", "exit_code", "source"}
    a, b = got[A], got[B]
    assert (a["status"], a["task"], a["model"], a["steps"], a["max_steps"]) == ("finished", "sudoku", "tiny", 12, 12)
    assert b["model"] == "trm-tiny" and b["status"] == "finished" and a["source"] == "inferred"
    for r in (a, b):  # evaluated at steps 6 and 12: the best of them
        records = [json.loads(line) for line in (runs / r["id"] / "metrics.jsonl").read_text().splitlines()]
        vals = [x["val_loss"] for x in records if "val_loss" in x]
        assert len(vals) == 2 and r["best_val_loss"] == min(vals)
        assert r["best_exact_accuracy"] == max(x["exact_accuracy"] for x in records if "exact_accuracy" in x)
        assert r["start"].startswith("2026-11-01T") and r["curves"].endswith("curves.png")
    f = got[FAILED]
    assert (f["status"], f["exit_code"], f["source"]) == ("failed", 1, "status.json")
    assert f["reason"] == "rank 1 on node1 failed first (exit code 1)" and f["nodes"] == ["node0", "node1"]
    assert f["duration_s"] == 65.0 and f["steps"] == 5 and f["max_steps"] == 100
    assert (got[STOPPED]["status"], got[STOPPED]["exit_code"]) == ("stopped", 130)
    assert got[STOPPED]["task"] == "sudoku"  # recorded before the rooms as auralm.train: still the trainer's run
    gone = got[GONE]
    assert gone["status"] == "stopped" and gone["source"] == "inferred" and "is gone" in gone["reason"]
    assert got[LIVE]["status"] == "running" and got[LIVE]["source"] == "status.json"
    assert got[UNKNOWN]["status"] == "unknown" and "no status.json" in got[UNKNOWN]["reason"]


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_runs_table_and_an_empty_or_missing_dir(runs, tmp_path, capsys):
    capsys.readouterr()
    assert main(["runs", "--dir", str(runs)]) == 0
    out = capsys.readouterr().out
    for word in (A, B, FAILED, "finished", "failed", "stopped", "running", "unknown", "12/12", "exact"):
        assert word in out, word
    assert "rank 1 on node1 failed first" in out  # why it did not finish, under the table
    (tmp_path / "empty").mkdir()
    for where in (tmp_path / "empty", tmp_path / "missing"):
        assert main(["runs", "--dir", str(where)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"no runs in {where}/")
        assert main(["runs", "--json", "--dir", str(where)]) == 0
        assert json.loads(capsys.readouterr().out) == []


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_logs_merged_by_time_by_prefix_and_one_node(runs, capsys):
    capsys.readouterr()
    assert main(["logs", "20261102-09", "--dir", str(runs)]) == 0  # a unique prefix of FAILED
    lines = capsys.readouterr().out.splitlines()
    bodies = [line.split(" │ ", 1) for line in lines]
    assert all(len(b) == 2 for b in bodies) and {b[0].strip() for b in bodies} == {"node0", "node1"}
    stamped = [b[1] for b in bodies if b[1][:2].isdigit()]
    assert stamped == sorted(stamped) and len(stamped) == 6  # the two nodes interleaved in time order
    assert bodies[-1][1].startswith("# hrmctl: rank 1 on node1 failed first")
    assert main(["logs", str(runs / FAILED), "--node", "node1", "--dir", str(runs)]) == 0
    assert capsys.readouterr().out == (runs / FAILED / "node1.log").read_text()
    assert main(["logs", FAILED, "--node", "node7", "--dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node0, node1" in err


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_unknown_or_ambiguous_run_is_one_line_exit_2(runs, capsys):
    capsys.readouterr()
    assert main(["logs", "20261101-10000-aaaa", "--dir", str(runs)]) == 2  # a digit short
    err = capsys.readouterr().err
    assert err.startswith("error: no run '20261101-10000-aaaa'") and err.count("\n") == 1
    assert f"nearest: {A}" in err
    assert main(["plot", "2026", "--dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and err.count("\n") == 1
    res = subprocess.run([sys.executable, "-m", "cli", "runs", "--dir", str(runs / "nope")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.startswith("no runs in")


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_logs_follow_until_the_run_ends(runs, tmp_path):
    from cli.runs.logs import show_logs

    run = tmp_path / "runs" / "20261103-080000-f011"
    shutil.copytree(runs / LIVE, run)
    buf = io.StringIO()
    done = threading.Event()

    def grow():
        time.sleep(0.4)
        with open(run / "localhost.log", "a") as f:
            f.write("12:00:01.000 [rank0]:step 2/100 | loss 1.0\n12:00:02.000 [rank0]:step 3/1")
            f.flush()
            time.sleep(0.3)
            f.write("00 | loss 0.7\n")
        status = json.loads((run / "status.json").read_text())
        (run / "status.json").write_text(json.dumps(dict(status, state="finished", exit_code=0, ended=time.time())))
        done.set()

    t = threading.Thread(target=grow)
    t.start()
    t0 = time.monotonic()
    assert show_logs(run, follow=True, out=buf, poll=0.05) == 0
    t.join()
    assert done.is_set() and time.monotonic() - t0 < 10
    assert buf.getvalue().splitlines() == ["12:00:00.000 [rank0]:step 1/100 | loss 2.0",
                                           "12:00:01.000 [rank0]:step 2/100 | loss 1.0",
                                           "12:00:02.000 [rank0]:step 3/100 | loss 0.7"]


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_plot_two_runs_to_a_png(runs, tmp_path, capsys):
    out = tmp_path / "loss.png"
    capsys.readouterr()
    assert main(["plot", A[:11], B, "--out", str(out), "--dir", str(runs)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    width, height = _png_size(out)
    assert (width, height) == (900, 520) and 15_000 < out.stat().st_size < 500_000
    keep = os.environ.get("HRMCTL_TEST_PNG_DIR")  # to look at it
    if keep:
        shutil.copy(out, Path(keep) / "plot-two-runs.png")
        shutil.copy(runs / A / "curves.png", Path(keep) / "curves-A.png")
        shutil.copy(runs / B / "curves.png", Path(keep) / "curves-B.png")
    assert main(["plot", A, "--metric", "val_loss", "--x", "samples", "--out", str(tmp_path / "v.png"),
                 "--dir", str(runs)]) == 0
    assert _png_size(tmp_path / "v.png") == (900, 520)


def test_plot_legend_names_what_differs():
    from cli.runs.catalog import Run
    from cli.runs.plot import legend

    def run(i, sync, model):
        return Run(id=i, path=Path(i), trainer_dir=Path(i), sync=sync, model=model)

    assert legend([run("a", "ddp", "tiny"), run("b", "diloco", "tiny")]) == ["a (ddp)", "b (diloco)"]
    assert legend([run("a", "ddp", "tiny"), run("b", "ddp", "rlm-tiny")]) == ["a (tiny)", "b (rlm-tiny)"]
    assert legend([run("a", "ddp", "tiny")]) == ["a"]


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_unknown_metric_and_x_are_one_line_exit_2(runs, capsys):
    capsys.readouterr()
    assert main(["plot", A, "--metric", "los", "--out", "x.png", "--dir", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown metric 'los'; available: ") and err.count("\n") == 1
    available = err.split("available: ", 1)[1].strip().split(", ")
    assert {"loss", "lr", "val_loss", "grad_norm", "exact_accuracy"} <= set(available) and "step" not in available
    assert not Path("x.png").exists()
    assert main(["plot", A, "--x", "tokens", "--dir", str(runs)]) == 2  # a sudoku run counts samples
    err = capsys.readouterr().err
    assert "available: step, time, samples" in err and err.count("\n") == 1


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_plot_in_the_terminal(runs, capsys):
    pytest.importorskip("plotext")
    capsys.readouterr()
    assert main(["plot", A, B, "--metric", "loss", "--dir", str(runs)]) == 0
    out = capsys.readouterr().out
    assert A in out and B in out and len(out.splitlines()) >= 12


@pytest.mark.slow  # the runs fixture trains two models (issue 35, item 6): not in --fast
def test_curves_png_after_a_run_and_none_without_matplotlib(runs, tmp_path, monkeypatch):
    from auralm.training import curves

    for r in (A, B):
        width, height = _png_size(runs / r / "curves.png")
        assert (width, height) == (900, 650) and (runs / r / "curves.png").stat().st_size > 15_000
    said = []
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if matplotlib were not installed
    shutil.copy(runs / A / "metrics.jsonl", tmp_path / "metrics.jsonl")
    assert curves.write_run_curves(tmp_path, said.append) is None
    assert len(said) == 1 and "matplotlib.figure is not installed" in said[0]
    assert not (tmp_path / "curves.png").exists()


def test_launcher_status_json(tmp_path):
    """What cli/launch writes at the start and the end of a run, and how the catalog reads it."""
    from cli.launch.run.attempt import RunResult
    from cli.launch.supervise.status import ended, started
    from cli.runs.catalog import load_run

    from cli.nodes.inventory import local_node

    node = local_node()
    plan = SimpleNamespace(node=node, nproc=1, cwd=str(tmp_path),
                           argv=["py", "-m", "torch.distributed.run", "--nnodes=1", "-m", "auralm.training.train",
                                 "model=tiny", "out_dir=elsewhere/r1"])
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    doc = started(run_dir, SimpleNamespace(run_id="r1", plans=[plan], backend="gloo",
                                           options=SimpleNamespace(module="auralm.training.train", detached=False)))
    saved = json.loads((run_dir / "status.json").read_text())
    assert saved["state"] == "running" and saved["pid"] == os.getpid() and saved["nodes"] == ["localhost"]
    assert saved["trainer_dir"] == str((tmp_path / "elsewhere" / "r1").resolve())
    assert load_run(run_dir).status == "running"  # this process is its launcher, and lives
    for result, error, state, code in [(RunResult(0, "every node finished"), None, "finished", 0),
                                       (RunResult(1, "rank 0 on localhost failed first (exit code 1)"), None,
                                        "failed", 1),
                                       (RunResult(130, "interrupted (Ctrl-C)", interrupted=True), None, "stopped", 130),
                                       (None, KeyboardInterrupt(), "stopped", 130),
                                       (None, RuntimeError("boom"), "failed", None)]:
        ended(run_dir, dict(doc), result, 1, error)
        saved = json.loads((run_dir / "status.json").read_text())
        assert (saved["state"], saved["exit_code"]) == (state, code) and saved["ended"] >= saved["started"]
        run = load_run(run_dir)
        assert (run.status, run.exit_code, run.source) == (state, code, "status.json")
    assert "boom" in run.reason


@pytest.mark.slow
def test_hrmctl_train_leaves_a_finished_run_with_status_and_curves(runs, tmp_path, sudoku_data):
    """A real local `hrmctl train`: status.json finished, the node log, curves.png; then runs, logs and plot."""
    data = sudoku_data(300)  # the puzzles the runs fixture trained on
    env = dict(os.environ, OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "cli", "train", "--run-id", "t1", f"data_dir={data}", "model=tiny",
                          "training.max_steps=4", "training.batch_size=8", "training.log_interval=1",
                          "training.eval_interval=4", "training.checkpoint_interval=0"],
                         capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    run = tmp_path / "runs" / "t1"
    status = json.loads((run / "status.json").read_text())
    assert (status["state"], status["exit_code"], status["nodes"]) == ("finished", 0, ["localhost"])
    assert (run / "curves.png").exists() and (run / "localhost.log").exists()
    res = subprocess.run([sys.executable, "-m", "cli", "runs", "--json"], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    [entry] = json.loads(res.stdout)
    assert (entry["id"], entry["status"], entry["steps"], entry["source"]) == ("t1", "finished", 4, "status.json")
    res = subprocess.run([sys.executable, "-m", "cli", "logs", "t"], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert res.returncode == 0 and "step 4/4" in res.stdout and "curves: runs/t1/curves.png" in res.stdout


def test_nodes_that_left_and_joined_are_listed_with_their_times(tmp_path, capsys):
    """training.elastic's record (cli/launch/supervise/elastic.py) in status.json: `runs --json` gives each leave and
    join with its time, the table says them under itself."""
    left, joined = OLD + 20, OLD + 50
    _hand_made(tmp_path / "el", {"task": "sudoku", "model": {"name": "tiny"}, "training": {"max_steps": 5}}, steps=5,
               status={"run_id": "el", "state": "finished", "started": OLD, "ended": OLD + 65, "host": "elsewhere",
                       "pid": 1, "exit_code": 0, "nodes": ["node0", "node1"],
                       "members": [{"t": left, "node": "node1", "event": "left", "why": "its link is down"},
                                   {"t": joined, "node": "node1", "event": "joined"}]})
    got = _json_runs(tmp_path, capsys)["el"]["members"]
    assert [(e["node"], e["event"]) for e in got] == [("node1", "left"), ("node1", "joined")]
    assert got[0]["t"] == time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(left)) and got[0]["why"]
    assert main(["runs", "--dir", str(tmp_path)]) == 0
    clock = lambda t: time.strftime("%H:%M:%S", time.localtime(t))  # noqa: E731
    assert f"el: node1 left at {clock(left)}; node1 joined at {clock(joined)}" in capsys.readouterr().out
