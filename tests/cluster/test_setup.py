"""`hrmctl setup` on lab nodes whose homes hold nothing of ours (Lab(bare=True)): no project, no venv.

The lab's nodes stand for machines without internet: no index is reachable from their namespaces, and setup
installs with --no-index from the wheels this machine sends (asserted on the command it reports). The wheels are
downloaded once a machine, into the wheel pool that every test session shares (conftest's own_cache).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from lab.nodes import ROOT, sh

# the first setup (wheels downloaded into the session's cache, two venvs) and removing the nodes' venvs at the
# end take minutes each on a loaded 2-core machine: more than the suite's 600 s for the item that pays for them
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

DIRTY = ["--allow-dirty"] if sh(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]).stdout.strip() \
    else []  # a shared working tree with others' edits; on CI's clean clone the exact commit is sent


def _head() -> str:
    """This checkout's commit now (others may commit while the tests run: a setup sends the one it found)."""
    return sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip()


TINY = ["model=tiny", "training.max_steps=4", "training.batch_size=8", "training.log_interval=1",
        "training.checkpoint_interval=0", "training.eval_interval=0", "training.eval_batches=1", "logging.curves=false"]
RECORDED_SMI = ROOT / "tests" / "recorded" / "nvidia-smi-rtx4090.txt"


@pytest.fixture(scope="module")
def bare(make_lab):
    lab = make_lab(2, bare=True)
    yield lab
    # the venvs and uv's caches (tens of thousands of files each) removed for both nodes at once, before the
    # lab removes its users one after the other
    threads = [threading.Thread(target=shutil.rmtree, args=(d,), kwargs={"ignore_errors": True})
               for n in lab.nodes for d in (n.home / "hrmctl", n.home / ".cache")]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


@pytest.fixture(scope="module")
def ready(bare, tmp_path_factory):
    """The first `hrmctl setup` of both bare nodes (its JSON and wall time), shared by the tests below."""
    cwd = tmp_path_factory.mktemp("setup")
    t0, before = time.monotonic(), _head()
    proc = _hrmctl(["setup", "--json", *DIRTY], bare.inventory, cwd, timeout=1800)
    return proc, time.monotonic() - t0, {before, _head()}


def _hrmctl(args, inventory, cwd, timeout=600, **kw):
    env = dict(os.environ, HRMCTL_INVENTORY=str(inventory))
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=cwd, **kw)


def _freeze(node) -> list[str]:
    out = node.as_user(f"{node.home}/hrmctl/.venv/bin/python -m pip freeze").stdout
    return [line.split("+")[0] if line.startswith("torch==") else line for line in out.splitlines()]


def _local_freeze() -> list[str]:
    out = sh([sys.executable, "-m", "pip", "freeze", "--exclude-editable"]).stdout
    return [line.split("+")[0] if line.startswith("torch==") else line for line in out.splitlines()]


def test_dry_run_on_bare_nodes_changes_nothing(bare, tmp_path):
    proc = _hrmctl(["setup", "--dry-run", "--json", *DIRTY], bare.inventory, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    for r in doc["nodes"]:
        assert r["venv_action"] == "would build" and r["venv_why"] == "no venv yet", r
        assert r["torch"]["requirement"].endswith("+cpu") and r["torch"]["index"].endswith("/whl/cpu"), r
        assert len(r["code_sent"]) == r["code_files"] > 50
    for node in bare.nodes:
        assert not (node.home / "hrmctl").exists(), "a dry run wrote the workdir"


def test_gpu_node_gets_the_cuda_build_its_driver_runs(bare, tmp_path):
    """A recorded `nvidia-smi` (RTX 4090, driver 570, CUDA 12.8) on node1's PATH: --dry-run names the cu128 build
    and PyTorch's cu128 index, and why. No CUDA is claimed here: only the choice is tested."""
    node = bare.node("node1")
    fake = node.home / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\ncat {fake / 'smi.txt'}\n")
    shutil.copy(RECORDED_SMI, fake / "smi.txt")
    os.chmod(fake / "nvidia-smi", 0o755)
    env_file = node.home / ".ssh" / "environment"
    env_file.write_text(f"PATH={fake}:/usr/local/bin:/usr/bin:/bin\n")
    sh(["chown", "-R", f"{node.user}:{node.user}", str(fake), str(env_file)])
    try:
        proc = _hrmctl(["setup", "--dry-run", "--json", "--nodes", "node1", *DIRTY], bare.inventory, tmp_path)
    finally:
        env_file.unlink()
        shutil.rmtree(fake)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    torch = json.loads(proc.stdout)["nodes"][0]["torch"]
    assert torch["requirement"] == "torch==2.13.0+cu128", torch
    assert torch["index"] == "https://download.pytorch.org/whl/cu128"
    assert "RTX 4090" in torch["why"] and "CUDA 12.8" in torch["why"]


def test_setup_then_doctor_then_train(bare, ready, nodes_sudoku, tmp_path):
    proc, seconds, heads = ready
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    print(f"first setup of 2 bare nodes: {seconds:.1f} s")
    mine = _local_freeze()
    for r, node in zip(doc["nodes"], bare.nodes):
        assert r["venv_action"] == "build" and r["commit"] in heads, r
        assert "--no-index" in r["install_command"] and "--find-links" in r["install_command"], r
        assert all(c["status"] == "ok" for c in r["checks"].values()), r["checks"]
        assert _freeze(node) == mine, f"{node.name}'s pip freeze differs from this machine's"
        assert (node.home / "hrmctl" / ".venv").is_symlink()
    code = _hrmctl(["doctor"], bare.inventory, tmp_path, timeout=300)
    assert code.returncode == 0, code.stdout + code.stderr
    # the default data given, as `hrmctl sync-data` would: the trainer making it on each node (two workers a node
    # for ~15 s, then 1000 held-out puzzles evaluated) cost this test about 25 of its 71 user CPU-s (accton), and is
    # tested where it is the point (test_launch.py's test_the_trainer_uses_each_nodes_data_dir_from_the_inventory)
    bare.give_data(nodes_sudoku, "sudoku")
    run = _hrmctl(["train", "--nodes", "node0,node1", "--run-id", "setup1", *TINY], bare.inventory, tmp_path,
                  timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "node0 r0 │ step 4/4" in run.stdout


def test_second_setup_is_a_no_op(bare, ready, tmp_path):
    assert ready[0].returncode == 0
    t0 = time.monotonic()
    proc = _hrmctl(["setup", "--json", *DIRTY], bare.inventory, tmp_path)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    for r in doc["nodes"]:
        assert r["venv_action"] == "unchanged" and r["wheels_sent"] == 0, r
        # a no-op is a few SSH round trips and one Python on the node (about 1 s on this 2-core machine, 2026-11);
        # 10 s leaves room for a machine three times slower under the suite's load, and is still far from a
        # reinstall (the first setup's venv and wheels: minutes). What makes it a no-op is asserted above
        assert r["seconds"] <= 10.0, f"{r['node']}: a no-op setup took {r['seconds']} s"
    print(f"second setup: {wall:.1f} s wall, per node {[r['seconds'] for r in doc['nodes']]}")


def test_older_commit_is_brought_forward(bare, ready, tmp_path):
    """node1 as an earlier setup left it: an older commit in its stamp, a file that commit had and this one has
    not, an older README. The doctor names `hrmctl setup` as the fix; setup brings node1 to this commit."""
    assert ready[0].returncode == 0
    node = bare.node("node1")
    work = node.home / "hrmctl"
    older = sh(["git", "-C", str(ROOT), "rev-list", "--max-count=1", "--skip=5", "HEAD"]).stdout.strip()
    stamp = json.loads((work / ".hrmctl-setup.json").read_text())
    stamp["commit"], stamp["dirty"] = older, False
    stamp["files"].append("cli/gone_in_this_commit.py")
    (work / ".hrmctl-setup.json").write_text(json.dumps(stamp))
    (work / "cli" / "gone_in_this_commit.py").write_text("# only in the older commit\n")
    (work / "README.md").write_text("# the README of an older commit\n")
    sh(["chown", "-R", f"{node.user}:{node.user}", str(work)])
    doctor = _hrmctl(["doctor"], bare.inventory, tmp_path, timeout=300)
    assert "different commits" in doctor.stdout and "hrmctl setup" in doctor.stdout, doctor.stdout
    heads = {_head()}
    proc = _hrmctl(["setup", "--json", "--nodes", "node1", *DIRTY], bare.inventory, tmp_path)
    heads.add(_head())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(proc.stdout)["nodes"][0]
    assert r["commit"] in heads and r["checks"]["commit"]["status"] == "ok"
    assert "README.md" in r["code_sent"] and r["code_removed"] == ["cli/gone_in_this_commit.py"]
    assert not (work / "cli" / "gone_in_this_commit.py").exists()
    assert (work / "README.md").read_bytes() == (ROOT / "README.md").read_bytes()


def test_killed_install_keeps_the_previous_venv(bare, ready, tmp_path):
    """SIGKILL of the node's install halfway (pip, the slow path, so there is time to kill it): the node's venv
    is still the previous one, complete, and the next setup finds it ready."""
    assert ready[0].returncode == 0
    node = bare.node("node0")
    link = node.home / "hrmctl" / ".venv"
    before = os.readlink(link)
    setup = subprocess.Popen([sys.executable, "-m", "cli", "setup", "--nodes", "node0", "--reinstall", "--pip",
                              *DIRTY], env=dict(os.environ, HRMCTL_INVENTORY=str(bare.inventory)), cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.monotonic() + 600
    while killed is None and time.monotonic() < deadline and setup.poll() is None:
        building = [p for p in link.parent.glob(".venv-*") if p.name != before]
        if len(list(building[0].glob("lib/python3*/site-packages/*")) if building else []) >= 10:  # halfway in
            ps = sh(["ps", "-ww", "-u", node.user, "-o", "pid=,args="], check=False).stdout
            for line in ps.splitlines():
                pid, _, args = line.strip().partition(" ")
                if "pip" in args and " install " in args and not args.startswith("python3 -c"):
                    os.kill(int(pid), signal.SIGKILL)
                    killed = args
        time.sleep(0.05)
    out, err = setup.communicate(timeout=300)
    assert killed, f"never saw the install running: {out}{err}"
    assert setup.returncode == 1, out + err
    assert "previous venv is still in place" in err
    assert os.readlink(link) == before
    half = [p for p in link.parent.glob(".venv-*") if p.name != before]
    assert half and not any((p / "hrmctl-venv.json").exists() for p in half), "the killed build looks complete"
    ok = node.as_user(f"{link}/bin/python -c 'import torch, transformers, numpy; print(torch.__version__)'")
    assert ok.stdout.strip().startswith("2.13.0")
    again = _hrmctl(["setup", "--json", "--nodes", "node0", *DIRTY], bare.inventory, tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads(again.stdout)["nodes"][0]["venv_action"] == "unchanged"
