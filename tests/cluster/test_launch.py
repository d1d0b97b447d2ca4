"""`hrmctl test-ddp` / `hrmctl train` on real sshd nodes: torchrun with gloo across namespaces.

Every job here is tiny (correctness only, or small sizes) so that each test takes seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from lab.nodes import sh
from tests.polling import wait_for



def job_pids(lab_node, run_id: str) -> list[tuple[int, str]]:
    """(pid, command line) of every process on the node whose environment carries the run id."""
    script = (f"for d in /proc/[0-9]*; do tr '\\0' '\\n' < $d/environ 2>/dev/null | grep -qx 'HRMCTL_RUN_ID={run_id}' "
              "&& echo \"${d#/proc/} $(tr '\\0' ' ' < $d/cmdline)\"; done; true")
    out = lab_node.as_user(script).stdout
    return [(int(l.split()[0]), l.split(" ", 1)[1] if " " in l else "") for l in out.splitlines() if l.strip()]


def is_worker(cmdline: str, module: str) -> bool:
    """A rank's process, not torchrun's agent (started plainly or through node/torchrun.py)."""
    return module in cmdline and "torch.distributed.run" not in cmdline and "-m node torchrun" not in cmdline


def start_hrmctl(args: list[str], inventory, cwd) -> subprocess.Popen:
    env = dict(os.environ, HRMCTL_INVENTORY=str(inventory))
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_test_ddp_two_nodes_and_dry_run_equals_real_launch(lab3, hrmctl, tmp_path):
    common = ["--nodes", "node0,node1", "--run-id", "ddp2", "--master-port", "29611",
              "--max-size", "64KiB", "--seconds", "0.02", "--json"]
    code, out, err = hrmctl("test-ddp", "--dry-run", *common, inventory=lab3.inventory)
    assert code == 0, err
    plan = json.loads(out)
    assert not (tmp_path / "runs").exists(), "--dry-run must run nothing"
    assert [n["node"] for n in plan["nodes"]] == ["node0", "node1"]
    for i, n in enumerate(plan["nodes"]):
        assert f"--node-rank={i}" in n["argv"] and "--nnodes=2" in n["argv"]
        assert f"--master-addr={lab3.nodes[0].ip}" in n["argv"] and "--master-port=29611" in n["argv"]
        assert n["env"]["GLOO_SOCKET_IFNAME"] == "eth0" and n["env"]["HRMCTL_BACKEND"] == "gloo"

    code, out, err = hrmctl("test-ddp", *common, inventory=lab3.inventory)
    assert code == 0, out + err
    doc = json.loads(out)
    res = doc["result"]
    assert res["ok"] and res["world_size"] == 2 and res["backend"] == "gloo"
    assert [r["host"] for r in res["ranks"]] == ["node0", "node1"]  # a rank on each node, really
    # the launcher chose gloo (no CUDA on the nodes), and the ranks agreed on it
    assert res["reason"] == "gloo requested" and [r["backend"] for r in res["ranks"]] == ["gloo", "gloo"]
    assert all(bad == [] for bad in res["checks"].values()) and set(res["checks"]) >= {
        "all_reduce", "broadcast", "all_gather", "barrier"}
    assert [r["bytes"] for r in res["bandwidth"]] == [1024, 4096, 16384, 65536]
    for row in res["bandwidth"]:
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])  # 2(n-1)/n = 1 for n = 2
        assert row["algbw_GBps"] > 0
    assert res["latency"]["p50_us"] > 0
    # what ran is exactly what --dry-run printed, node by node
    for n in plan["nodes"]:
        log = (tmp_path / "runs" / "ddp2" / f"{n['node']}.log").read_text()
        assert f"# command: {n['command']}\n" in log


def test_first_launch_checks_its_guess_on_the_nodes_and_caches_the_answers(lab3, hrmctl, tmp_path):
    """Nodes never launched on: the plan guesses torch's answers without torch, node/torchrun.py
    confirms them with torchrun's own import, and the next launch takes them from the cache: torchrun through the
    same wrapper, with nothing to check."""
    cache = tmp_path / "cache"
    common = ["--nodes", "node1,node2", "--no-bandwidth", "--json"]
    for run_id, starter in (("cold", "-m node torchrun --expect"), ("warm", "-m node torchrun -- ")):
        code, out, err = hrmctl("test-ddp", *common, "--run-id", run_id, inventory=lab3.inventory,
                                env={"HRMCTL_CACHE": str(cache)})
        assert code == 0, out + err
        assert json.loads(out)["result"]["ok"]
        for name in ("node1", "node2"):
            log = (tmp_path / "runs" / run_id / f"{name}.log").read_text()
            assert log.count("# command: ") == 1 and starter in log, log[:2000]
            assert run_id == "cold" or "--expect" not in log, log[:2000]
        if run_id == "cold":
            facts = json.loads((cache / "torch-facts.json").read_text())
            assert sorted(k.split("|")[0] for k in facts) == ["node1", "node2"]
            assert all(f["gpus"] == 0 and f["libuv_ok"] and not f["nccl"] for f in facts.values())


def test_a_wrong_first_launch_guess_is_planned_again(hrmctl, tmp_path):
    """A GPU the driver lists but torch cannot use (a CPU-only torch on a GPU machine): the guess
    says NCCL, the node's torch says no, and the launcher plans again with gloo before anything ran.
    The driver is the one mocked part (no NVIDIA driver here): an `nvidia-smi` that lists one GPU."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: Mock GPU (UUID: GPU-0)'\n")
    (fake / "nvidia-smi").chmod(0o755)
    cache = tmp_path / "cache"
    code, out, err = hrmctl("test-ddp", "--no-bandwidth", "--json", "--run-id", "guess", env={
        "HRMCTL_CACHE": str(cache), "PATH": f"{fake}:{os.environ['PATH']}"})
    assert code == 0, out + err
    res = json.loads(out)["result"]
    assert res["ok"] and res["backend"] == "gloo"
    assert "differs from the first launch's guess" in err and "planning again" in err and "gloo for all" in err
    log = (tmp_path / "runs" / "guess" / "localhost.log").read_text()
    assert "gpus 1 -> 0" in log and log.count("# command: ") == 2
    [facts] = json.loads((cache / "torch-facts.json").read_text()).values()
    assert facts["gpus"] == 0 and facts["nccl"] is False


def test_test_ddp_three_nodes(lab3, hrmctl):
    code, out, err = hrmctl("test-ddp", "--nodes", "node2,node0,node1", "--no-bandwidth", "--json",
                            inventory=lab3.inventory)
    assert code == 0, out + err
    res = json.loads(out)["result"]
    assert res["world_size"] == 3 and res["ok"]
    assert [r["host"] for r in res["ranks"]] == ["node2", "node0", "node1"]  # the first named is rank 0


# Left alone, node1's rank would wait for its dead peer in a collective for training.dist_timeout (300 s) before
# failing: the launcher stops it long before. A bound against that wait, not a speed: 0.7-0.9 s alone here, 14.4 s in a
# fresh CI's first phase (a 2-core Xeon, 2026-12-07): a machine three times slower under that load stays within this
STOPPED_WITHIN_S = 60


def test_killed_trainer_on_one_node_stops_the_others(lab3, tmp_path):
    proc = start_hrmctl(["train", "--nodes", "node1,node2", "--run-id", "kill1", "model=tiny",
                         "training.max_steps=100000", "training.batch_size=8", "training.log_interval=1",
                         "training.eval_interval=0", "training.checkpoint_interval=0", "fault.step_sleep=0.1"],
                        lab3.inventory, tmp_path)  # paced: the ranks wait for the kill instead of taking both cores
    log = tmp_path / "runs" / "kill1" / "node1.log"  # the nodes of the 2-node train test: data made once
    try:
        def first_step():
            if proc.poll() is not None:
                pytest.fail(f"hrmctl ended before the first step: {proc.communicate()[1][-2000:]}")
            return log.exists() and "[rank0]:step " in log.read_text()
        wait_for(first_step, 120, "the first training step")
        workers = [p for p, c in job_pids(lab3.nodes[2], "kill1") if is_worker(c, "auralm.training.train")]
        assert workers, "no trainer process on node2"
        t0 = time.monotonic()
        lab3.nodes[2].as_user(f"kill -9 {workers[0]}")
        out, err = proc.communicate(timeout=STOPPED_WITHIN_S + 30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode not in (0, None), out + err
    assert elapsed < STOPPED_WITHIN_S, f"the other node was stopped only after {elapsed:.1f}s"
    assert "error: rank 1 on node2 was killed by SIGKILL (out of memory? see `dmesg` on node2)" in err, err
    assert "exit code -9" not in err and "Traceback" not in err
    for n in lab3.nodes[1:]:
        assert job_pids(n, "kill1") == [], f"processes of the job left on {n.name}"


def test_firewalled_master_port_refused_before_launch(lab3, hrmctl, tmp_path):
    master = lab3.nodes[0]
    rule = ["INPUT", "-p", "tcp", "--dport", "29633", "-j", "DROP"]
    master.netns(["iptables", "-I", *rule])
    try:
        code, out, err = hrmctl("test-ddp", "--nodes", "node0,node1", "--master-port", "29633", "--no-bandwidth",
                                inventory=lab3.inventory, timeout=60)
    finally:
        master.netns(["iptables", "-D", *rule])
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "node1 cannot reach node0" in lines[0] and "29633" in lines[0] and "fix:" in lines[0]
    assert not (tmp_path / "runs").exists(), "nothing may start when the preflight refuses"


def test_missing_python_or_workdir_named_with_the_node(lab3, hrmctl, tmp_path):
    base = lab3.inventory.read_text()
    for extra, expect in (('python = "/nope/python3"', "node1: python '/nope/python3' not found"),
                          ('workdir = "~/no-such-dir"', "node1: workdir ~/no-such-dir")):
        inv = tmp_path / "hrmctl.toml"
        inv.write_text(base.replace(f'user = "{lab3.nodes[1].user}"', f'user = "{lab3.nodes[1].user}"\n{extra}'))
        code, out, err = hrmctl("test-ddp", "--nodes", "node0,node1", "--no-bandwidth", inventory=inv, timeout=60)
        assert code != 0
        assert err.startswith("error: ") and expect in err and len(err.strip().splitlines()) == 1, err


TINY = ["model=tiny", "training.max_steps=4", "training.batch_size=8", "training.log_interval=1",
        "training.checkpoint_interval=2", "training.eval_interval=0", "training.eval_batches=1", "logging.curves=false"]


def test_nans_on_one_node_are_skipped_everywhere_then_recovered_from_rank_0_over_the_network(lab3, hrmctl, tmp_path):
    """The NaN guard across two machines: rank 1 (node2) has non-finite gradients at steps 3-5;
    every rank skips those updates, then rank 0 (node1) restores its snapshot of step 2 and
    broadcasts it over gloo, and both nodes end with the same parameters."""
    args = [*TINY, "training.max_steps=7", "training.checkpoint_interval=0", "guard.snapshot_every=2",
            "guard.max_bad=3", "fault.nan_at_step=3-5", "fault.nan_rank=1"]
    code, out, err = hrmctl("train", "--nodes", "node1,node2", "--run-id", "nan2", *args, inventory=lab3.inventory,
                            timeout=240)
    assert code == 0, out + err
    run = lab3.node("node1").home / "hrmctl" / "runs" / "nan2"
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    guard = [(e["kind"], e["step"]) for e in events if e["kind"] in ("nan_skip", "recovery")]
    assert guard == [("nan_skip", 3), ("nan_skip", 4), ("nan_skip", 5), ("recovery", 5)], events
    assert all(e["rank"] == [1] for e in events if e["kind"] == "nan_skip")
    recovery = next(e for e in events if e["kind"] == "recovery")
    assert recovery["restored_step"] == 2 and recovery["equal"], recovery
    assert len(recovery["checksums"]) == 2 and len(set(recovery["checksums"])) == 1
    assert "node1 r0 │ step 7/7" in out and "nan guard" in out


def test_train_with_no_nodes_runs_here_on_the_default_task(hrmctl, tmp_path):
    code, out, err = hrmctl("train", "--run-id", "solo", *TINY, timeout=240)
    assert code == 0, out + err
    assert "localhost r0 │ step 4/4" in out
    assert (tmp_path / "data" / "sudoku").is_dir()  # the embedded default made its data offline
    assert (tmp_path / "runs" / "solo" / "checkpoint-4").is_dir() and (tmp_path / "runs" / "solo" / "localhost.log").is_file()


def test_rejected_trainer_override_found_before_anything_starts(lab3, hrmctl, tmp_path):
    code, out, err = hrmctl("train", "--nodes", "node0,node1", "training.max_stepz=3", inventory=lab3.inventory)
    assert code != 0
    assert err.startswith("error: trainer overrides rejected: ") and "max_stepz" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


# a fault made on node1: how hrmctl must say it noticed, and what it saw there (cli/launch/run/lost.py)
LOST_FAULTS = {"link-down": ("no SSH keep-alive reply for ", "its link is down (no answer from "),
               "sigstop": ("no SSH keep-alive reply for ", "its processes are frozen (")}


@pytest.mark.parametrize("fault", list(LOST_FAULTS))
def test_a_lost_node_is_named_with_what_was_seen_and_leaves_nothing(lab3, tmp_path, fault):
    """Its link cut (every packet in and out dropped), or every process of its user stopped (SIGSTOP: a sleeping
    laptop): named within 30 s from the SSH keep-alive heartbeat, with what a fresh look found; exit 255. (Its
    processes killed is not a lost node: its job reports the signal, `torchrun on node1 (rank 1) was killed by ...`.)"""
    victim = lab3.nodes[1]
    run_id = f"lost-{fault}"
    proc = start_hrmctl(["test-ddp", "--nodes", "node0,node1", "--no-bandwidth", "--soak", "120",
                         "--run-id", run_id], lab3.inventory, tmp_path)
    rules = [["INPUT", "-j", "DROP"], ["OUTPUT", "-j", "DROP"]]
    try:
        wait_for(lambda: any(is_worker(c, "auralm.planning.ddp_check") for _, c in job_pids(victim, run_id)), 60,
                 "the job's rank on node1")
        t0 = time.monotonic()
        if fault == "link-down":
            for r in rules:
                victim.netns(["iptables", "-I", *r])
        else:
            sh(["pkill", "-STOP", "-u", victim.user])
        out, err = proc.communicate(timeout=60)
        noticed = time.monotonic() - t0
    finally:
        for r in rules:
            victim.netns(["iptables", "-D", *r], check=False)
        sh(["pkill", "-CONT", "-u", victim.user], check=False)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 255, out + err
    last = err.strip().splitlines()[-1]
    how, seen = LOST_FAULTS[fault]
    assert f"node1 stopped answering ({how}" in last and seen in last, err
    assert "Traceback" not in err, err
    assert fault != "sigstop" or "(2 of the job's 2 processes stopped" in last, last  # torchrun and its rank
    print(f"{fault}: hrmctl ended {noticed:.1f}s after the fault: {last}")
    assert noticed < 30, f"a lost node took {noticed:.0f}s to notice and stop"
    assert job_pids(lab3.nodes[0], run_id) == []
    # node1's sshd hangs up the job's PTY when the connection dies, or the stop killed it: nothing is orphaned there
    wait_for(lambda: job_pids(victim, run_id) == [], 40, "the job on node1 to be gone")


def test_max_restarts_restarts_the_whole_job(hrmctl, tmp_path):
    """A job that fails once, then succeeds: --max-restarts 1 runs it again (locally, real torchrun)."""
    (tmp_path / "flaky.py").write_text(
        "import os, sys, pathlib\n"
        "mark = pathlib.Path('attempted')\n"
        "if not mark.exists():\n"
        "    mark.write_text('1'); print('first attempt fails', flush=True); sys.exit(3)\n"
        "print('second attempt ok', flush=True)\n")
    code, out, err = hrmctl("train", "--module", "flaky", "--run-id", "flaky", timeout=120)
    assert code != 0 and "rank 0 on localhost failed first" in err, out + err  # without restarts: one failure
    (tmp_path / "attempted").unlink()
    code, out, err = hrmctl("train", "--module", "flaky", "--max-restarts", "1", "--run-id", "flaky2", timeout=120)
    assert code == 0, out + err
    assert "restart 1 of 1" in out and "second attempt ok" in out
    log = (tmp_path / "runs" / "flaky2" / "localhost.log").read_text()
    assert "attempt 1" in log and "attempt 2" in log


def test_max_restarts_resumes_the_real_trainer_from_its_last_checkpoint(lab3, hrmctl, tmp_path):
    """Rank 1 (node2) is killed once at step 6, after checkpoint-4 (rank 1 reaches step 6 only once
    rank 0 has saved checkpoint-4); the restarted job resumes from it in the same run directory
    (the fault fires only in a run that did not resume) and finishes."""
    args = ["model=tiny", "training.max_steps=8", "training.batch_size=8", "training.log_interval=1",
            "training.checkpoint_interval=2", "training.eval_interval=0", "training.eval_batches=1",
            "fault.kill_at_step=6", "fault.kill_rank=1", "logging.curves=false"]
    code, out, err = hrmctl("train", "--nodes", "node1,node2", "--run-id", "rs1", "--max-restarts", "1", *args,
                            inventory=lab3.inventory, timeout=240)
    assert code == 0, out + err
    assert ("rank 1 on node2 was killed by SIGKILL (out of memory? see `dmesg` on node2); restart 1 of 1 from the "
            "last checkpoint") in out, out
    node1 = (tmp_path / "runs" / "rs1" / "node1.log").read_text()
    node2 = (tmp_path / "runs" / "rs1" / "node2.log").read_text()
    first, second = node1.split("# hrmctl launch, attempt 2,")
    assert "[rank0]:saved runs/rs1/checkpoint-4" in first and "[rank0]:step 6/8" not in first
    assert "resume=" not in first.split("# command: ")[1].splitlines()[0]
    command = second.split("# command: ")[1].splitlines()[0]
    assert command.endswith(" out_dir=runs/rs1 resume=latest"), command
    assert "[rank0]:resuming from runs/rs1/checkpoint-4 (step 4)" in second
    assert "[rank0]:step 5/8" in second and "[rank0]:step 8/8" in second
    assert node2.count("fault: killing rank 1 at step 6") == 1 and "attempt 2" in node2
    run_dir = lab3.node("node1").home / "hrmctl" / "runs" / "rs1"
    assert (run_dir / "checkpoint-8").is_dir()
    assert [json.loads(l)["step"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()][-4:] == [5, 6, 7, 8]


def test_sync_data_before_launch(lab3, hrmctl, tmp_path):
    (tmp_path / "data" / "extra").mkdir(parents=True)
    (tmp_path / "data" / "extra" / "shard.bin").write_bytes(b"x" * 100_000)
    code, out, err = hrmctl("train", "--nodes", "node0,node1", "--sync-data", "--module", "auralm.planning.ddp_check",
                            "--no-bandwidth", inventory=lab3.inventory, timeout=120)
    assert code != 0 and "unknown option --no-bandwidth" in err  # train's extra arguments are key=value only
    # the trainer's 4 tiny steps on the nodes' data (ddp_check's default bandwidth sweep, up to 64 MiB messages, took
    # about 15 s of CPU more for nothing this test looks at)
    code, out, err = hrmctl("train", "--nodes", "node0,node1", "--sync-data", "--run-id", "sync1", *TINY,
                            "training.checkpoint_interval=0", inventory=lab3.inventory, timeout=180)
    assert code == 0 and "node0 r0 │ step 4/4" in out, out + err
    for n in lab3.nodes[:2]:
        assert (n.home / "hrmctl" / "data" / "extra" / "shard.bin").read_bytes() == b"x" * 100_000


def test_master_port_in_use_is_refused(lab3, hrmctl, tmp_path):
    holder = subprocess.Popen(["ip", "netns", "exec", lab3.nodes[0].ns, sys.executable, "-c",
                               "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 29644)); s.listen(); "
                               "print('up', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "up"
        code, out, err = hrmctl("test-ddp", "--nodes", "node0,node1", "--master-port", "29644", "--no-bandwidth",
                                inventory=lab3.inventory, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "master port 29644 is already in use on node0" in err and "--master-port" in err
    assert not (tmp_path / "runs").exists()


def test_hrm_trains_across_two_nodes_with_rows_halting_differently_on_each(lab3, hrmctl, tmp_path):
    """HRM with ACT on two lab nodes: one segment a step on every rank, whatever halted where; its Q-head is
    made to halt by input (a fresh one halts no row before halt_max_steps), so the two ranks' rows finish at
    different steps; both nodes end with the same parameters."""
    args = ["model=hrm-tiny", "model.n_embd=32", "model.n_head=2", "model.halt_max_steps=4",
            "training.batch_size=8", "training.log_interval=1", "training.eval_interval=0", "training.dtype=fp32",
            "training.checkpoint_interval=2", "logging.curves=false"]
    code, out, err = hrmctl("train", "--nodes", "node1,node2", "--run-id", "hrm2", *args, "training.max_steps=2",
                            inventory=lab3.inventory, timeout=240)
    assert code == 0, out + err
    node1 = lab3.node("node1")
    ckpt = node1.home / "hrmctl" / "runs" / "hrm2" / "checkpoint-2"
    assert (ckpt / "carry.pt").is_file()
    from tests.trainer.test_hrm_training import q_head_that_halts_by_input

    owner = (ckpt / "model.safetensors").stat()
    q_head_that_halts_by_input(ckpt.parent, 2)
    for f in ("model.safetensors", "checksums.json"):
        os.chown(ckpt / f, owner.st_uid, owner.st_gid)
    code, out, err = hrmctl("train", "--nodes", "node1,node2", "--run-id", "hrm2b", *args, "training.max_steps=10",
                            "resume=runs/hrm2/checkpoint-2", inventory=lab3.inventory, timeout=240)
    assert code == 0, out + err
    assert "resuming from runs/hrm2/checkpoint-2 (step 2)" in out
    run = node1.home / "hrmctl" / "runs" / "hrm2b"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    by_rank = [r["halted_by_rank"] for r in rows if r["step"] > 2]
    assert len(by_rank) == 8 and any(a != b for a, b in by_rank), by_rank
    final = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if '"checksum"' in line]
    assert final[-1]["equal"] and len(set(final[-1]["checksums"])) == 1


def test_unwritable_directories_are_refused_before_anything_starts(lab3, hrmctl, tmp_path):
    """The master's workdir (where its run directory goes) not writable by the node's user; then a worker
    whose inventory data_dir is in a directory it cannot write (the default sudoku data would be made
    there): each is one line naming node, directory and fix, exit 1, and nothing starts anywhere."""
    node1, node2 = lab3.node("node1"), lab3.node("node2")
    work = node1.home / "hrmctl"
    # the workdir, and its runs/ when an earlier test made it (the new run's directory goes there)
    locked = [d for d in (work, work / "runs") if d.is_dir()]
    modes = [d.stat().st_mode for d in locked]
    for d in locked:
        d.chmod(0o555)
    try:
        code, out, err = hrmctl("train", "--nodes", "node1,node2", "--run-id", "ro1", *TINY,
                                inventory=lab3.inventory, timeout=120)
    finally:
        for d, mode in zip(locked, modes):
            d.chmod(mode)
    assert code == 1, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    # the run directory (runs/ro1), or first the data directory (data/sudoku) when its data is not there yet
    assert lines[0].startswith("error: node1: cannot write the ") and (f"{work}/runs/ro1: " in lines[0]
                                                                        or f"{work}/data/sudoku: " in lines[0])
    blocked = next(str(d) for d in locked if f": {d} is not writable by" in lines[0])
    assert (f": {blocked} is not writable by {node1.user}; fix: on node1 `sudo chown -R {node1.user} {blocked}`, "
            f"or ") in lines[0], lines[0]
    assert not (tmp_path / "runs").exists() and not (work / "runs" / "ro1").exists()
    assert job_pids(node1, "ro1") == [] and job_pids(node2, "ro1") == []

    ro = node2.home / "ro"
    ro.mkdir()
    shutil.chown(ro, node2.user, node2.user)
    ro.chmod(0o555)
    inv = tmp_path / "hrmctl.toml"
    inv.write_text(lab3.inventory.read_text().replace(f'user = "{node2.user}"',
                                                      f'user = "{node2.user}"\ndata_dir = "~/ro/data"'))
    try:
        code, out, err = hrmctl("train", "--nodes", "node1,node2", "--run-id", "ro2", *TINY, inventory=inv,
                                timeout=120)
    finally:
        shutil.rmtree(ro)
    assert code == 1, out + err
    assert err.strip() == (f"error: node2: cannot write the data directory {ro}/data/sudoku: {ro} is not writable by "
                           f"{node2.user}; fix: on node2 `sudo chown -R {node2.user} {ro}`, or set data_dir for node2 "
                           "in the inventory"), err
    assert not (tmp_path / "runs").exists() and not (node1.home / "hrmctl" / "runs" / "ro2").exists()


def test_the_trainer_uses_each_nodes_data_dir_from_the_inventory(lab3, hrmctl, tmp_path):
    """node1's data_dir is under its home (`~/`), node2's relative to its workdir; both hold the same small
    dataset there, and nothing in the default place (`<workdir>/data/sudoku`) is looked at; the run's
    checkpoints are on node1 (global rank 0) alone, its merged log names node and rank. Then a node whose
    data_dir has no data yet gets the default sudoku data generated there."""
    from tests.trainer.helpers import small_sudoku

    node0, node1, node2 = lab3.nodes
    ds = small_sudoku(tmp_path / "ds" / "sudoku", 600)
    places = {"node1": node1.home / "mydata" / "sudoku", "node2": node2.home / "hrmctl" / "their-data" / "sudoku"}
    for n, place in zip((node1, node2), places.values()):
        shutil.copytree(ds, place)
        subprocess.run(["chown", "-R", f"{n.user}:{n.user}", str(place.parent)], check=True)
    inv = tmp_path / "hrmctl.toml"
    text = lab3.inventory.read_text()
    text = text.replace(f'user = "{node1.user}"', f'user = "{node1.user}"\ndata_dir = "~/mydata"')
    text = text.replace(f'user = "{node2.user}"', f'user = "{node2.user}"\ndata_dir = "their-data"')
    text = text.replace(f'user = "{node0.user}"', f'user = "{node0.user}"\ndata_dir = "~/gen"')
    inv.write_text(text)
    try:
        code, out, err = hrmctl("train", "--nodes", "node1,node2", "--run-id", "dd1", *TINY, inventory=inv,
                                timeout=240)
        assert code == 0, out + err
        node1_log = (tmp_path / "runs" / "dd1" / "node1.log").read_text()
        node2_log = (tmp_path / "runs" / "dd1" / "node2.log").read_text()
        assert f"data_dir={places['node1']} " in node1_log.split("# command: ")[1]  # `~/` is node1's home
        assert "data_dir=their-data/sudoku " in node2_log.split("# command: ")[1]  # relative: from the workdir
        assert "[rank0]:held-out exact accuracy" in node1_log and f"test puzzles of {places['node1']} " in node1_log
        assert "generating" not in node1_log + node2_log  # read where it was; rank 1 agreed on the same data
        assert "[rank0]:step 4/4" in node1_log and "out_dir=runs/dd1" in node1_log
        assert "node1 r0 │ step 4/4" in out  # the merged log names node and rank
        rank0 = node1.home / "hrmctl" / "runs" / "dd1"  # the default run directory, in the first node's workdir
        assert sorted(p.name for p in rank0.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
        assert not list((node2.home / "hrmctl" / "runs").glob("dd1/checkpoint-*")), "only global rank 0 writes them"

        code, out, err = hrmctl("train", "--nodes", "node0", "--run-id", "dd2", *TINY, "training.max_steps=1",
                                inventory=inv, timeout=300)
        assert code == 0, out + err
        gen = node0.home / "gen" / "sudoku"
        assert f"generating the default sudoku data in {gen} ..." in out
        assert (gen / "meta.json").is_file() and gen.owner() == node0.user
    finally:
        for place in (*places.values(), node0.home / "gen" / "sudoku"):
            shutil.rmtree(place.parent, ignore_errors=True)


HRM_GUIDE = ["arch=hrm_v1", "data_path=data/sudoku-extreme-small", "global_batch_size=4", "lr=1e-4",
             "arch.hidden_size=32", "arch.H_layers=1", "arch.L_layers=1", "arch.num_heads=1", "arch.expansion=2",
             "training.max_steps=1"]


def test_data_missing_on_a_node_is_refused_before_launch_with_the_command_that_makes_it(lab3, hrmctl, tmp_path):
    """issue 33, item 8: the HRM guide's data_path on node0 but not on node1. The dry run and the launch refuse in
    one line naming node1, the path and the prepare-data line with its --preset; nothing starts on any node. Once
    this machine's ./data has it, the line names `hrmctl sync-data node1`, and after that sync the dry run passes."""
    from tests.trainer.helpers import prepare_data

    node0, node1 = lab3.nodes[:2]
    made = tmp_path / "made" / "sudoku-extreme-small"
    assert prepare_data(["--task", "sudoku", "--out", str(made), "--train", "12", "--test", "4"]) == 0
    on_node0 = node0.home / "hrmctl" / "data" / "sudoku-extreme-small"
    on_node1 = node1.home / "hrmctl" / "data" / "sudoku-extreme-small"
    shutil.copytree(made, on_node0)
    subprocess.run(["chown", "-R", f"{node0.user}:{node0.user}", str(on_node0)], check=True)
    want = (f"error: node1: {on_node1} holds no prepared data (no such directory, or empty); fix: `hrmctl prepare-data "
            "--task sudoku --preset sudoku-extreme-small --out data/sudoku-extreme-small` here, then "
            "`hrmctl sync-data node1`")
    try:
        for dry in (["--dry-run"], []):
            code, out, err = hrmctl("train", "--nodes", "node0,node1", "--run-id", "nodata1", *dry, *HRM_GUIDE,
                                    inventory=lab3.inventory, timeout=180)
            assert code == 1 and err.strip().splitlines()[-1] == want, out + err
            assert "Traceback" not in out + err and "torch.distributed.run" not in out
        assert job_pids(node0, "nodata1") == [] and job_pids(node1, "nodata1") == []
        assert not (tmp_path / "runs" / "nodata1").exists()
        shutil.copytree(made, tmp_path / "data" / "sudoku-extreme-small")
        code, out, err = hrmctl("train", "--nodes", "node0,node1", "--dry-run", *HRM_GUIDE, inventory=lab3.inventory,
                                timeout=180)
        assert code == 1 and err.strip().splitlines()[-1].endswith(
            "fix: `hrmctl sync-data node1` (this machine's data/sudoku-extreme-small has it)"), out + err
        code, out, err = hrmctl("sync-data", "node1", inventory=lab3.inventory, timeout=180)
        assert code == 0, out + err
        code, out, err = hrmctl("train", "--nodes", "node0,node1", "--dry-run", *HRM_GUIDE, inventory=lab3.inventory,
                                timeout=180)
        assert code == 0 and "-m node torchrun -- " in out, out + err
    finally:
        shutil.rmtree(on_node0, ignore_errors=True)
        shutil.rmtree(on_node1, ignore_errors=True)


def test_data_missing_here_alone_is_refused_before_launch(hrmctl, tmp_path):
    """The same with no --nodes: this machine alone, its ./data."""
    for dry in (["--dry-run"], []):
        code, out, err = hrmctl("train", "--run-id", "nodata0", *dry, *HRM_GUIDE, timeout=180)
        assert code == 1, out + err
        assert err.strip().splitlines()[-1] == (f"error: localhost: {tmp_path}/data/sudoku-extreme-small holds no prepared data (no such "
                               "directory, or empty); fix: `hrmctl prepare-data --task sudoku --preset "
                               "sudoku-extreme-small --out data/sudoku-extreme-small`"), err
    assert not (tmp_path / "runs").exists()
