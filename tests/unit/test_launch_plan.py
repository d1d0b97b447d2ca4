"""The launch plan (per-node torchrun command + environment) and the launcher's bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.nodes.inventory import Node
from cli.launch.preflight import storage
from cli.launch.plan.options import parse_env_options
from cli.launch.plan.plan import NodeFacts, build_plan, choose_backend
from cli.errors import HrmctlError
from node import torchrun as node_torchrun
from node.lines import last
from node.ship import program

ROOT = Path(__file__).resolve().parents[2]


def node(name: str, host: str, **kw) -> Node:
    return Node(name=name, host=host, user="u", python=f"/py/{name}", workdir=f"~/w/{name}", **kw)


def plan(facts=None, nodes=None, **kw):
    nodes = nodes or [node("a", "10.0.0.1"), node("b", "10.0.0.2", ifname="wlan0")]
    facts = facts or {"a": NodeFacts(cpus=8, ifname="eth0"), "b": NodeFacts(cpus=4, gpus=2, nccl=True, ifname="eth1")}
    args = dict(master_addr="10.0.0.1", master_port=29500, backend="gloo", entry=["-m", "auralm.training.train", "x=1"],
                run_id="r1", user_env={"WANDB_API_KEY": "s3cret", "FOO": "bar"})
    args.update(kw)
    return build_plan(nodes, facts, **args)


def test_each_node_gets_its_rank_nproc_and_interface():
    a, b = plan()
    assert a.node_rank == 0 and b.node_rank == 1
    assert a.nproc == 1 and b.nproc == 2  # auto: one per GPU, else one
    assert list(a.ranks) == [0] and list(b.ranks) == [1, 2]
    for p in (a, b):
        assert "--nnodes=2" in p.argv and "--master-addr=10.0.0.1" in p.argv and "--rdzv-backend=static" in p.argv
        assert p.argv[0] == f"/py/{p.node.name}" and p.cwd == f"~/w/{p.node.name}"
        assert p.argv[-3:] == ["-m", "auralm.training.train", "x=1"]
        assert p.env["HRMCTL_WORLD_SIZE"] == "3" and p.env["FOO"] == "bar"
    assert a.env["GLOO_SOCKET_IFNAME"] == "eth0"  # from its route to the master
    assert b.env["GLOO_SOCKET_IFNAME"] == b.env["NCCL_SOCKET_IFNAME"] == "wlan0"  # the inventory wins
    assert a.env["OMP_NUM_THREADS"] == "8" and b.env["OMP_NUM_THREADS"] == "2"
    assert a.env["HRMCTL_JOB"] != b.env["HRMCTL_JOB"]


def test_a_restart_resumes_from_the_latest_checkpoint_with_the_rest_of_the_line_unchanged():
    """run.py's restart: the module's own arguments get resume=latest in place of theirs; torchrun's and the
    environment stay as planned (a torchrun option is never read as the trainer's)."""
    a, b = plan(entry={"a": ["-m", "auralm.training.train", "x=1", "resume=runs/r0/checkpoint-2"],
                       "b": ["-m", "auralm.training.train", "x=1", "--resume"]})
    for p in (a, b):
        again = p.resumed()
        assert again.argv[:p.args_at] == p.argv[:p.args_at] and p.argv[p.args_at - 2:p.args_at] == [
            "-m", "auralm.training.train"]
        assert again.argv[p.args_at:] == ["x=1", "resume=latest"] and again.env == p.env
        assert again.resumed().argv == again.argv  # twice is once
    assert a.argv[-1] == "resume=runs/r0/checkpoint-2"  # the plan itself is not changed


def test_the_inventorys_threads_win_over_the_usable_cpus_per_process():
    a, b = plan(nodes=[node("a", "10.0.0.1", threads=3), node("b", "10.0.0.2")])
    assert a.env["OMP_NUM_THREADS"] == "3" and b.env["OMP_NUM_THREADS"] == "2"  # b: 4 usable CPUs, 2 processes


def test_guessed_facts_start_torchrun_through_the_check_of_the_guess():
    facts = {"a": NodeFacts(cpus=8, guessed=True), "b": NodeFacts(cpus=4, gpus=2, nccl=True)}
    a, b = plan(facts=facts)
    assert a.argv[1:7] == ["-m", "node", "torchrun", "--expect", '{"gpus":0,"nccl":false,"libuv_ok":true}', "--"]
    assert b.argv[1:3] == ["-m", "torch.distributed.run"]
    plain, _ = plan(facts={"a": NodeFacts(cpus=8), "b": facts["b"]})
    assert a.argv[7:] == plain.argv[3:] and a.env == plain.env  # the same torchrun either way
    # a node whose project has the wrapper starts torchrun through it with nothing to check (its cheaper end)
    wrapped, _ = plan(facts={"a": NodeFacts(cpus=8, wrapped=True), "b": facts["b"]})
    assert wrapped.argv[1:5] == ["-m", "node", "torchrun", "--"] and wrapped.argv[5:] == plain.argv[3:]
    from node.torchrun import options

    assert options(wrapped.argv[4:]) == ({}, plain.argv[3:])
    assert any("guessed" in n for n in a.notes) and not any("guessed" in n for n in b.notes)


def test_a_run_nodes_may_leave_shortens_torchruns_exit_barrier_through_the_node_wrapper():
    facts = {"a": NodeFacts(cpus=8, guessed=True), "b": NodeFacts(cpus=4)}
    a, b = plan(facts=facts, exit_barrier=10.0)
    assert a.argv[1:5] == ["-m", "node", "torchrun", "--expect"] and a.argv[6:9] == ["--exit-barrier", "10", "--"]
    assert b.argv[1:7] == ["-m", "node", "torchrun", "--exit-barrier", "10", "--"]
    _, plain = plan(facts={"a": NodeFacts(cpus=8), "b": facts["b"]})
    assert b.argv[7:] == plain.argv[3:]  # the same torchrun arguments after the wrapper's own
    assert node_torchrun.options(["--exit-barrier", "10", "--", "--nnodes=2"]) == ({"--exit-barrier": "10"},
                                                                                   ["--nnodes=2"])
    assert node_torchrun.options(["--", "x"]) == ({}, ["x"])  # nothing of its own: torchrun with its cheaper end
    for bad in (["--exit-barrier", "--", "x"], ["--other", "1", "--", "x"], ["--expect", "{}"]):
        assert node_torchrun.options(bad) is None, bad


def test_the_node_check_refuses_a_wrong_guess_before_torchrun_starts():
    res = subprocess.run([sys.executable, "-m", "node", "torchrun", "--expect",
                          '{"gpus": 3, "nccl": true, "libuv_ok": true}', "--", "--nnodes=1", "-m", "nothing.here"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 75, res.stdout + res.stderr
    tag, _, doc = res.stdout.splitlines()[0].partition(": ")
    assert tag == "hrmctl-node-facts" and json.loads(doc)["gpus"] == 0
    assert "gpus 3 -> 0" in res.stdout and "nccl True -> False" in res.stdout
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("code", [75, 3])
def test_ranks_counted_out_end_their_torchrun_in_one_line_and_other_failures_keep_torchruns_report(tmp_path, code):
    """A node's ranks counted out of a DiLoCo run that went on without it (asleep, cut off) end with exit 75
    (node.torchrun.LEFT_OUT_EXIT, auralm/training/members.py): its torchrun ends with one line, not torchrun's
    ChildFailedError traceback, on the screen at every such rejoin. Any other failure keeps torchrun's report: the
    launcher reads the rank that failed first from its "Root Cause"."""
    worker = tmp_path / "worker.py"
    worker.write_text(f"import sys\nsys.exit({code})\n")
    res = subprocess.run([sys.executable, "-m", "node", "torchrun", "--exit-barrier", "1", "--",
                          "--standalone", "--nproc-per-node=1", str(worker)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 1, res.stdout + res.stderr
    if code == 75:
        assert "Traceback" not in res.stderr and "Root Cause" not in res.stderr, res.stderr
        assert res.stderr.strip().splitlines()[-1] == (
            "torchrun ends: its rank(s) 0 were counted out of the run (exit 75); hrmctl starts this node again when "
            "it answers"), res.stderr
    else:
        assert "Root Cause (first observed failure)" in res.stderr and "exitcode  : 3" in res.stderr, res.stderr


def test_a_held_torchrun_runs_with_the_arguments_and_environment_sent_later_or_ends_with_nothing_started(tmp_path):
    """cli/launch/preflight/prestart.py on a Slurm allocation (without Slurm: the held process here, as srun's task
    would be): torchrun imported first, then its arguments and environment on stdin; a start it cannot serve is refused;
    a cancelled one ends before anything ran. The allocation itself: tests/cluster/test_slurm.py."""
    from cli.launch.preflight.prestart import HELD, takes
    from cli.nodes.srun import Held
    from lab.local import free_port

    n = Node(name="a", host="10.0.0.1", user="u", python=sys.executable, workdir=str(ROOT))
    plain = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    assert takes(n, plain, {"HRMCTL_JOB": "r/a"}, str(ROOT)) == {"argv": plain[3:], "env": {"HRMCTL_JOB": "r/a"}}
    assert takes(n, plain, {"PYTHONPATH": "cli/launch/nolibuv"}, str(ROOT)) is None  # read as Python starts
    assert takes(n, plain, {}, "/elsewhere") is None
    checked = [sys.executable, "-m", "node", "torchrun", "--expect", "{}", "--", *plain[3:]]
    assert takes(n, checked, {}, str(ROOT)) == {"argv": plain[3:], "env": {}, "own": {"--expect": "{}"}}
    assert takes(n, [sys.executable, *HELD, *plain[3:]], {}, str(ROOT)) is None

    def held() -> Held:
        return Held(subprocess.Popen([sys.executable, *HELD], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True), lambda *a: None)

    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint('worker', os.environ.get('HELD_SEEN'), sys.argv[1:], flush=True)\n")
    lines: list[str] = []
    port = free_port()  # not torchrun's default 29500, which a launch in another test may have just chosen
    argv = ["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=static", "--master-addr=127.0.0.1",
            f"--master-port={port}", "--max-restarts=0", str(script), "x=1"]
    job = held().go({"argv": argv, "env": {"HELD_SEEN": "yes"}}, lambda stream, line: lines.append(line))
    assert job.wait(120) == 0, lines
    assert any("worker yes ['x=1']" in ln for ln in lines), lines
    cancelled = held()
    cancelled.cancel()
    assert cancelled.proc.poll() is not None
    # a first launch on the node: the guessed facts checked by the held process, with the torch it imported
    lines.clear()
    guess = json.dumps({"gpus": 3, "nccl": True, "libuv_ok": True})
    job = held().go({"argv": argv, "env": {}, "own": {"--expect": guess}}, lambda stream, line: lines.append(line))
    assert job.wait(120) == node_torchrun.FACTS_DIFFER, lines
    assert any(ln.startswith("hrmctl-node-facts: ") for ln in lines) and not any("worker" in ln for ln in lines)


def test_torchrun_held_ahead_by_the_batch_job_is_taken_over_by_the_launchs_session(tmp_path, monkeypatch):
    """cli/slurm/job.py holds torchrun before the launch's sessions exist (prestart.hold_ahead); the session made for
    that node takes it over and the launch's hold_torchrun starts no second one. Without Slurm: `srun` here is a
    stand-in that runs its command in place (a real allocation: tests/cluster/test_slurm.py)."""
    from cli.launch.preflight import prestart
    from cli.nodes import srun

    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(srun, "_AHEAD", {})
    n = Node(name="n1", host="10.0.0.1", user="u", python=sys.executable, workdir=str(ROOT), slurm_job="7")
    prestart.hold_ahead([n], "r1")
    held = srun._AHEAD["n1"]
    session = srun.SrunSession(n)
    assert session.held is held and not srun._AHEAD
    prestart.hold_torchrun({"n1": session}, [n], "r1")
    assert session.held is held  # kept, not held again
    assert srun.SrunSession(n).held is None  # taken once
    assert held.proc.poll() is None
    session.close()  # a preflight that failed: the held torchrun ends, nothing started
    assert held.proc.poll() is not None and session.held is None


def test_secrets_are_left_out_of_what_is_shown_but_not_of_what_runs():
    a, _ = plan()
    assert "s3cret" not in a.shell_line(redact=True) and "WANDB_API_KEY=***" in a.shell_line(redact=True)
    assert "WANDB_API_KEY=s3cret" in a.shell_line()


def test_libuv_off_and_slow_dns_only_where_the_probe_says_so():
    facts = {"a": NodeFacts(libuv_ok=False, slow_dns=True), "b": NodeFacts()}
    a, b = plan(facts=facts)
    assert a.env["USE_LIBUV"] == "0" and a.env["PYTHONPATH"] == "cli/launch/nolibuv" and "RES_OPTIONS" in a.env
    assert "USE_LIBUV" not in b.env and "PYTHONPATH" not in b.env and "RES_OPTIONS" not in b.env


def test_backend_auto_is_nccl_only_when_every_node_has_cuda_and_nccl():
    gpu, cpu = NodeFacts(gpus=1, nccl=True), NodeFacts()
    assert choose_backend("auto", {"a": gpu, "b": gpu})[0] == "nccl"
    backend, why = choose_backend("auto", {"a": gpu, "b": cpu})
    assert backend == "gloo" and "b" in why
    assert choose_backend("gloo", {"a": gpu})[0] == "gloo"


def test_env_options():
    assert parse_env_options(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ("A", "=1", "1A=2", "A B=1"):
        with pytest.raises(HrmctlError, match="KEY=VALUE"):
            parse_env_options([bad])


@pytest.mark.slow  # seconds of real work (hrmctl train --dry-run; torch processes): not in --fast (issue 35, item 6)
def test_nolibuv_sitecustomize_turns_libuv_off_in_the_static_rendezvous():
    """torch 2.13's static rendezvous ignores USE_LIBUV; the sitecustomize makes it honour it."""
    code = ("import importlib, datetime, torch.distributed as d\n"
            "s = importlib.import_module('torch.distributed.elastic.rendezvous.static_tcp_rendezvous')\n"
            "st = s.TCPStore('127.0.0.1', 0, 1, True, datetime.timedelta(seconds=5), multi_tenant=True)\n"
            "print(st.libuvBackend)")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "cli" / "launch" / "nolibuv"))
    out = {v: subprocess.run([sys.executable, "-c", code], env=dict(env, USE_LIBUV=v), capture_output=True,
                             text=True, timeout=120).stdout.strip() for v in ("0", "1")}
    assert out == {"0": "False", "1": "True"}


def run_cli(*args, cwd, inventory=None):
    env = dict(os.environ)
    env.pop("HRMCTL_INVENTORY", None)
    if inventory:
        env["HRMCTL_INVENTORY"] = str(inventory)
    p = subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, cwd=cwd, env=env,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args, expect", [
    (["train", "--nodes", "nodeX"], "unknown node 'nodeX'"),
    (["train", "--nodes", "node0,node0"], "named twice"),
    (["train", "--nodes", "node0", "--nproc", "0"], "--nproc 0"),
    (["test-ddp", "--nodes", "node0", "--master-port", "70000"], "outside 1-65535"),
    (["train", "--nodes", "node0", "--env", "NOEQUALS"], "KEY=VALUE"),
    (["train", "--nodes", "node0", "--bogus-flag"], "unknown option --bogus-flag"),
    (["train", "--nodes", "node0", "--backend", "mpi"], "choose auto, gloo or nccl"),
    (["train", "--nodes", "node0", "--max-restarts", "-1"], "Invalid value for '--max-restarts'"),
])
def test_bad_input_is_one_line_and_nothing_starts(tmp_path, args, expect):
    inv = tmp_path / "hrmctl.toml"
    inv.write_text('[nodes.node0]\nhost = "192.0.2.1"\n')  # TEST-NET: must never be contacted
    code, out, err = run_cli(*args, cwd=tmp_path, inventory=inv)
    assert code != 0
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert expect in err
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- the preflight's look at the directories


def look(spec: dict) -> dict:
    """The node side of the directory check, run here as the nodes run it (node/dirs.py sent by node.ship, by this
    Python)."""
    res = subprocess.run([sys.executable, "-", json.dumps(spec)], input=program("dirs"), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return last(res.stdout)


def test_directories_writable_with_room_or_one_line_naming_node_directory_and_fix(tmp_path):
    work = tmp_path / "work"
    (work / "data" / "sudoku").mkdir(parents=True)
    (work / "data" / "sudoku" / "train_000.bin").write_bytes(b"x" * 162)
    (work / "data" / "sudoku" / "meta.json").write_text(json.dumps(
        {"format": storage.DATA_FORMAT, "task": "sudoku", "files": {"train_000.bin": {"bytes": 162, "sha256": ""}}}))
    (work / "blocked").write_text("a file where a directory should be")
    form = {"format": storage.DATA_FORMAT, "base": "data"}
    dirs = [{"kind": "data", "path": "data/sudoku", "generate": True, "task": "sudoku", **form},  # there: only read
            {"kind": "data", "path": "data/lm", "generate": False, "task": "lm", **form},  # missing, not generated
            {"kind": "data", "path": "fresh/sudoku", "generate": True, "task": "sudoku", **form},  # made in work/fresh
            {"kind": "run", "path": "runs/r1"},
            {"kind": "run", "path": "blocked/r1"}]
    ans = look({"workdir": str(work), "min_free": 1, "dirs": dirs})
    assert ans["psutil"] is True and ans["user"]
    got = {d["path"]: d["problem"] for d in ans["dirs"]}
    assert got == {"data/sudoku": None, "data/lm": {"why": "nodata", "at": str(work / "data" / "lm")},
                   "fresh/sudoku": None, "runs/r1": None,
                   "blocked/r1": {"why": "notdir", "at": str(work / "blocked")}}
    assert [d["resolved"] for d in ans["dirs"]][:1] == [str(work / "data" / "sudoku")]
    assert not (work / "runs").exists() and not (work / "fresh").exists(), "the check writes nothing"

    full = look({"workdir": str(work), "min_free": 1 << 62, "dirs": dirs})  # no disk has 4 EiB free
    problems = {d["path"]: d["problem"] for d in full["dirs"]}
    assert problems["data/sudoku"] is None and problems["data/lm"]["why"] == "nodata"  # read only: no room needed
    assert problems["runs/r1"]["why"] == "space" and problems["runs/r1"]["at"] == str(work)
    assert problems["fresh/sudoku"]["why"] == "space"

    home = look({"workdir": "~/w", "min_free": 1, "dirs": [{"kind": "run", "path": "~/x/runs"}]})
    assert home["dirs"][0]["resolved"] == os.path.expanduser("~/x/runs")

    d = dict(full["dirs"][3], resolved="/home/u/w/runs/r1")
    line = storage.problem_line("node1", d, "u", False)
    assert line.startswith("node1: only ") and "MB free for the run directory" in line and "fix: " in line
    d = {"kind": "run", "resolved": "/home/u/w/runs/r1", "problem": {"why": "unwritable", "at": "/home/u/w"}}
    assert storage.problem_line("node1", d, "u", False) == (
        "node1: cannot write the run directory (out_dir: logs and checkpoints) /home/u/w/runs/r1: /home/u/w is not "
        "writable by u; fix: on node1 `sudo chown -R u /home/u/w`, or give out_dir= a directory u can write on node1")
    d = {"kind": "data", "resolved": "/srv/d/sudoku", "problem": {"why": "unwritable", "at": "/srv"}}
    assert storage.problem_line("node2", d, "u", True).endswith("or set data_dir for node2 in the inventory")

    storage.check_local(str(work / "runs" / "r1"))  # hrmctl's own logs, here: fine
    with pytest.raises(HrmctlError, match=f"cannot write hrmctl's logs to {work}/blocked/r1: {work}/blocked is a "
                                          "file, not a directory; fix: ") as exc:
        storage.check_local(str(work / "blocked" / "r1"))
    assert exc.value.exit_code == 1


def test_data_not_prepared_for_the_task_is_one_line_with_the_command_that_makes_it(tmp_path, monkeypatch):
    """issue 33, item 8: each way a node's data directory can fail the task, seen by node/dirs.py as a node sees it,
    and the line: prepare-data with the --preset a directory named like one needs, or sync-data when this
    machine's ./data has it (sync-data sends ./data to the node's data_dir)."""
    from auralm.data import datadir
    from tests.trainer.helpers import prepare_data

    work, here = tmp_path / "work", tmp_path / "here"
    good = work / "data" / "sudoku-extreme-small"
    assert prepare_data(["--task", "sudoku", "--out", str(good), "--train", "12", "--test", "4"]) == 0
    (work / "hrm").mkdir()
    (work / "hrm" / "dataset.json").write_text("{}")  # the HRM repository's own layout: not ours
    form = {"format": storage.DATA_FORMAT, "base": "data"}

    def problem(path, task="sudoku"):
        ans = look({"workdir": str(work), "min_free": 1, "dirs": [{"kind": "data", "path": path, "task": task, **form}]})
        return ans["dirs"][0]

    assert problem("data/sudoku-extreme-small")["problem"] is None
    assert problem("data/sudoku-extreme-small", task="lm")["problem"] == {"why": "task", "at": str(good),
                                                                          "found": "sudoku"}
    assert problem("hrm")["problem"]["why"] == "notprepared"
    (good / "val_000.bin").write_bytes(b"short")
    assert problem("data/sudoku-extreme-small")["problem"] == {"why": "files", "at": str(good / "val_000.bin")}
    missing = problem("data/sudoku-extreme-small2")
    assert missing["problem"]["why"] == "nodata"

    monkeypatch.chdir(here.mkdir() or here)
    line = storage.problem_line("node1", {**missing, "local": False}, "u", False)
    assert line == (f"node1: {work}/data/sudoku-extreme-small2 holds no prepared data (no such directory, or empty); "
                    "fix: `hrmctl prepare-data --task sudoku --out data/sudoku-extreme-small2` here, then "
                    "`hrmctl sync-data node1`")
    lost = problem("data/sudoku-extreme-small")
    line = storage.problem_line("node1", {**lost, "local": False}, "u", False)
    assert line.endswith("fix: `hrmctl prepare-data --task sudoku --preset sudoku-extreme-small --out "
                         "data/sudoku-extreme-small` here, then `hrmctl sync-data node1`"), line
    assert prepare_data(["--task", "sudoku", "--out", "data/sudoku-extreme-small", "--train", "12", "--test", "4"]) == 0
    line = storage.problem_line("node1", {**lost, "local": False}, "u", False)
    assert line.endswith("fix: `hrmctl sync-data node1` (this machine's data/sudoku-extreme-small has it)"), line
    line = storage.problem_line("localhost", {**lost, "local": True}, "u", False)
    assert line == (f"localhost: {good} holds data whose files do not match its meta.json ({good}/val_000.bin is "
                    "missing or of another size); fix: `hrmctl prepare-data --task sudoku --preset "
                    "sudoku-extreme-small --out data/sudoku-extreme-small`")
    assert datadir.FORMAT == storage.DATA_FORMAT


def test_unwritable_seen_as_the_node_user_sees_it(tmp_path, monkeypatch):
    """os.access as a user without write permission (root may write anywhere, so it is told no here)."""
    from node import dirs

    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if p == str(tmp_path) else real(p, mode))
    spec = {"workdir": str(tmp_path), "min_free": 1,
            "dirs": [{"kind": "run", "path": "runs/x"}, {"kind": "data", "path": "data/sudoku", "generate": True}]}
    got = [d["problem"] for d in dirs.check(spec)["dirs"]]
    assert got == [{"why": "unwritable", "at": str(tmp_path)}] * 2


def test_the_trainers_directories_under_hrmctl():
    from auralm.training.command_line import parse

    dirs, extra = storage.trainer_dirs(parse(["model=tiny"]), "r1")
    assert (dirs.task, dirs.data_given, dirs.out_dir, extra) == ("sudoku", None, "runs/r1", ["out_dir=runs/r1"])
    dirs, extra = storage.trainer_dirs(parse(["task=lm", "+data_paths=['/d/x']", "checkpoint_path=/o"]), "r1")
    assert (dirs.task, dirs.data_given, dirs.out_dir, extra) == ("lm", "/d/x", "/o", [])
    dirs, extra = storage.trainer_dirs(parse(["run_name=mine", "data_path=d"]), "r1")
    assert (dirs.data_given, dirs.out_dir, extra) == ("d", "runs/mine", [])
    assert storage.node_data_dir(node("a", "h", data_dir="data"), "sudoku") == "data/sudoku"  # from workdir
    assert storage.node_data_dir(node("a", "h", data_dir="~/ds/"), "lm") == "~/ds/lm"
    assert storage.node_data_dir(node("a", "h", data_dir="/"), "lm") == "/lm"


def test_data_dir_per_node_goes_to_the_trainer_with_its_marker():
    entry = {"a": ["-m", "auralm.training.train", "data_dir=data/sudoku", "out_dir=runs/r1"],
             "b": ["-m", "auralm.training.train", "data_dir=/home/b/d/sudoku", "out_dir=runs/r1"]}
    a, b = plan(entry=entry, node_env={"a": {"HRMCTL_DEFAULT_DATA_DIR": "data/sudoku"}})
    assert a.argv[-2:] == ["data_dir=data/sudoku", "out_dir=runs/r1"] and b.argv[-2] == "data_dir=/home/b/d/sudoku"
    assert a.env["HRMCTL_DEFAULT_DATA_DIR"] == "data/sudoku" and "HRMCTL_DEFAULT_DATA_DIR" not in b.env


# ---------------------------------------------------------------- the failing rank, by name and signal


ROOT_CAUSE_REPORT = """\
============================================================
auralm.training.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-24_10:00:01
  host      : node1
  rank      : 3 (local_rank: 1)
  exitcode  : 1 (pid: 12)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-24_10:00:00
  host      : node1
  rank      : 2 (local_rank: 0)
  exitcode  : -9 (pid: 11)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 11
============================================================"""


class FakeJob:
    def __init__(self, code):
        self.code = code

    def wait(self, timeout=None):
        return self.code


def test_a_rank_killed_by_a_signal_is_named_by_it(tmp_path):
    from rich.console import Console

    from cli.launch.run.attempt import _failure
    from cli.launch.run.log import MergedLog

    plans = plan(nodes=[node("a", "10.0.0.1"), node("b", "10.0.0.2")],
                 facts={"a": NodeFacts(cpus=2), "b": NodeFacts(cpus=2)}, nproc=2)
    log = MergedLog(Console(file=open(os.devnull, "w")), tmp_path, plans, quiet=True)
    log.start(plans, 1)
    for line in ROOT_CAUSE_REPORT.splitlines():
        log.line("b", None, line)
    assert log.failed_rank == {"b": 2} and log.exitcode == {"b": -9}  # the root cause, not the failure before it
    jobs = {"a": FakeJob(1), "b": FakeJob(1)}
    res = _failure(plans, log, jobs, {"a": 1}, "a")  # a ended first, on the broken connection
    assert res.reason == "rank 2 on b was killed by SIGKILL (out of memory? see `dmesg` on b)"
    assert (res.failed_node, res.failed_rank, res.code) == ("b", 2, 1)

    log.start(plans, 2)
    for line in ROOT_CAUSE_REPORT.replace("-9 (pid: 11)  (SIGKILL)", "-15 (pid: 11)").splitlines():
        log.line("b", None, line)
    res = _failure(plans, log, jobs, {"b": 1}, "b")
    assert res.reason == "rank 2 on b was killed by SIGTERM"  # the OOM hint is for SIGKILL only
    log.start(plans, 3)
    res = _failure(plans, log, {"a": FakeJob(-11), "b": FakeJob(None)}, {"a": -11}, "a")  # a local torchrun
    assert res.reason == "torchrun on a (ranks 0-1) was killed by SIGSEGV" and res.code == 139
    log.close()


def test_the_stop_finds_the_jobs_processes_by_their_tag_and_leaves_the_rest(tmp_path):
    """node/jobs.py's stop, sent as the launcher sends it, with psutil: everything tagged with the job (here a process
    that ignores SIGTERM, and its child in a session of its own, as torchrun's workers are) is stopped; an untagged one
    stays. Its states before: both running."""
    from node.ship import program

    tree = ("import os, signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
            "print('up', flush=True)\n"
            "time.sleep(60)\n")
    job = subprocess.Popen([sys.executable, "-c", tree], env=dict(os.environ, HRMCTL_JOB="r9/a"),
                           stdout=subprocess.PIPE, text=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env=dict(os.environ, HRMCTL_JOB="r9/b"))
    try:
        assert job.stdout.readline().strip() == "up"

        def jobs(*args: str) -> dict:
            res = subprocess.run([sys.executable, "-", *args], input=program("jobs"), capture_output=True, text=True,
                                 timeout=30, cwd="/")
            assert res.returncode == 0, res.stderr
            return json.loads(res.stdout)

        assert jobs("states", "r9/a") == {"states": {"sleeping": 2}}  # the agent and its worker
        assert jobs("stop", "r9/a", "0.5") == {"found": 2, "left": 0}  # both found; none left
        assert job.wait(5) == -9  # it ignored SIGTERM: SIGKILL after the grace period
        assert other.poll() is None  # another job's process is not touched
    finally:
        for p in (job, other):
            if p.poll() is None:
                p.kill()
            p.wait()


def test_a_config_file_is_spelled_out_here_and_data_train_path_leaves_the_data_directory_to_the_trainer(tmp_path):
    from auralm.training.command_line import parse
    from cli.errors import HrmctlError
    from cli.launch.plan.options import TRAINER
    from cli.launch.plan.overrides import expand_config_files

    cfg = tmp_path / "rlm.yaml"
    cfg.write_text("model: {name: rlm-tiny, mhc_flows: 2}\ntraining: {optimizer: {lr: 3.0e-4}}\n"
                   "data: {train_path: /data/corpus.jsonl}\n")
    args = expand_config_files(TRAINER, ["training.max_steps=5", f"config={cfg}", "model.mhc_flows=4"])
    assert args == ["model.name=rlm-tiny", "model.mhc_flows=2", "training.optimizer.lr=0.0003",
                    "data.train_path=/data/corpus.jsonl", "training.max_steps=5", "model.mhc_flows=4"]
    assert expand_config_files(TRAINER, ["model=tiny"]) == ["model=tiny"]  # no file: no process started
    dirs, _ = storage.trainer_dirs(parse(args), "r1")
    assert (dirs.task, dirs.train_path) == ("lm", "/data/corpus.jsonl")
    node = Node(name="n0", host="h", user="u", data_dir="/srv/data")
    assert storage._spec(node, dirs, master=True)["dirs"] == [{"kind": "run", "path": "runs/r1"}]
    with pytest.raises(HrmctlError, match="nope.yaml: no such file"):
        expand_config_files(TRAINER, [f"config={tmp_path / 'nope.yaml'}"])


def test_the_port_of_a_run_on_one_node_is_free_and_not_an_ephemeral_one():
    """A run on one node alone gets a free port below the node's ephemeral range: an ephemeral port can be taken by
    any process's outgoing connection between the choice and torchrun's listen (EADDRINUSE at the rendezvous, seen
    in CI); ports asked for are tried first, a busy one skipped."""
    import socket
    import subprocess
    import sys

    from cli.launch.preflight.prepare import DEFAULT_PORTS
    from node.ship import program

    def pick(*ports: int) -> int:  # node/free_port.py as the launcher sends it (the bootstrap, no project path)
        avoid = f"{DEFAULT_PORTS.start}-{DEFAULT_PORTS.stop - 1}"
        res = subprocess.run([sys.executable, "-c", program("free_port"), "--avoid", avoid, *map(str, ports)],
                             capture_output=True, text=True, timeout=30, check=True, cwd="/")
        return json.loads(res.stdout)["port"]

    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    got = {pick() for _ in range(3)}
    assert all(20000 <= p < min(low, 32768) and p not in DEFAULT_PORTS for p in got), (got, low)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert pick(taken) != taken


def test_the_trainers_reading_of_the_overrides_is_made_once_for_the_args_every_stage_reads(monkeypatch):
    """LaunchOptions.trainer: the trainer's parser once for these args (the stages read the one Config), again when
    the command has changed them (a guide's spellings read into them), never for another module."""
    from auralm.training import command_line
    from cli.launch.plan.options import LaunchOptions

    calls = []
    parse = command_line.parse_command_line
    monkeypatch.setattr(command_line, "parse_command_line", lambda args: calls.append(list(args)) or parse(args))
    opts = LaunchOptions(nodes=[], args=["arch=hrm_v1", "data_path=d"])
    assert opts.trainer.model.name == "hrm-27m" and opts.trainer.data_dir == "d" and opts.trainer_refusal == ""
    assert opts.trainer is opts.trainer and len(calls) == 1
    opts.args = [*opts.args, "training.max_steps=3"]
    assert opts.trainer.training.max_steps == 3 and len(calls) == 2
    again = dataclasses.replace(opts, args=["model=tiny"])
    assert again.trainer.model.name == "tiny" and opts.trainer.model.name == "hrm-27m"
    bad = LaunchOptions(nodes=[], args=["model=no-such-model"])
    assert bad.trainer is None and bad.trainer_refusal.startswith("model='no-such-model': expected one of")
    other = LaunchOptions(nodes=[], module="auralm.planning.ddp_check", args=["--seconds", "1"])
    assert other.trainer is None and other.trainer_refusal == ""
