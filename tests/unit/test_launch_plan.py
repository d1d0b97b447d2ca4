"""The launch plan (per-node torchrun command + environment) and the launcher's bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.nodes.inventory import Node
from cli.launch.plan import NodeFacts, build_plan, choose_backend, parse_env_options
from cli.errors import HrmctlError

ROOT = Path(__file__).resolve().parents[2]


def node(name: str, host: str, **kw) -> Node:
    return Node(name=name, host=host, user="u", python=f"/py/{name}", workdir=f"~/w/{name}", **kw)


def plan(facts=None, nodes=None, **kw):
    nodes = nodes or [node("a", "10.0.0.1"), node("b", "10.0.0.2", ifname="wlan0")]
    facts = facts or {"a": NodeFacts(cpus=8, ifname="eth0"), "b": NodeFacts(cpus=4, gpus=2, nccl=True, ifname="eth1")}
    args = dict(master_addr="10.0.0.1", master_port=29500, backend="gloo", entry=["-m", "auralm.train", "x=1"],
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
        assert p.argv[-3:] == ["-m", "auralm.train", "x=1"]
        assert p.env["HRMCTL_WORLD_SIZE"] == "3" and p.env["FOO"] == "bar"
    assert a.env["GLOO_SOCKET_IFNAME"] == "eth0"  # from its route to the master
    assert b.env["GLOO_SOCKET_IFNAME"] == b.env["NCCL_SOCKET_IFNAME"] == "wlan0"  # the inventory wins
    assert a.env["OMP_NUM_THREADS"] == "8" and b.env["OMP_NUM_THREADS"] == "2"
    assert a.env["HRMCTL_JOB"] != b.env["HRMCTL_JOB"]


def test_guessed_facts_start_torchrun_through_the_check_of_the_guess():
    facts = {"a": NodeFacts(cpus=8, guessed=True), "b": NodeFacts(cpus=4, gpus=2, nccl=True)}
    a, b = plan(facts=facts)
    assert a.argv[1:6] == ["-m", "cli.launch.node_torchrun", "--expect", '{"gpus":0,"nccl":false,"libuv_ok":true}', "--"]
    assert b.argv[1:3] == ["-m", "torch.distributed.run"]
    plain, _ = plan(facts={"a": NodeFacts(cpus=8), "b": facts["b"]})
    assert a.argv[6:] == plain.argv[3:] and a.env == plain.env  # the same torchrun either way
    assert any("guessed" in n for n in a.notes) and not any("guessed" in n for n in b.notes)


def test_the_node_check_refuses_a_wrong_guess_before_torchrun_starts():
    res = subprocess.run([sys.executable, "-m", "cli.launch.node_torchrun", "--expect",
                          '{"gpus": 3, "nccl": true, "libuv_ok": true}', "--", "--nnodes=1", "-m", "nothing.here"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 75, res.stdout + res.stderr
    tag, _, doc = res.stdout.splitlines()[0].partition(": ")
    assert tag == "hrmctl-node-facts" and json.loads(doc)["gpus"] == 0
    assert "gpus 3 -> 0" in res.stdout and "nccl True -> False" in res.stdout
    assert "Traceback" not in res.stderr


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
    (["train", "--nodes", "node0", "--max-restarts", "-1"], "Invalid value for '--max-restarts': Input should be greater than or equal to 0"),
])
def test_bad_input_is_one_line_and_nothing_starts(tmp_path, args, expect):
    inv = tmp_path / "hrmctl.toml"
    inv.write_text('[nodes.node0]\nhost = "192.0.2.1"\n')  # TEST-NET: must never be contacted
    code, out, err = run_cli(*args, cwd=tmp_path, inventory=inv)
    assert code != 0
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert expect in err
    assert not (tmp_path / "runs").exists()
