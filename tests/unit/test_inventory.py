"""Inventory resolution and every bad input named in the ground issue: one line, non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cli.errors import InventoryError
from cli.nodes.inventory import load_inventory
from cli.nodes.remote import command_line

GOOD = """
master = "desk"
[defaults]
user = "aura"
python = "~/Aura_dev/.venv/bin/python"
workdir = "~/Aura_dev"
data_dir = "~/Aura_dev/data"

[nodes.laptop1]
host = "192.168.1.10"
nproc = "auto"

[nodes.desk]
host = "192.168.1.11"
ifname = "enp3s0"
port = 2222
nproc = 2
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HRMCTL_INVENTORY", raising=False)
    return tmp_path / "home"


def write(tmp_path, text, name="hrmctl.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_layers_and_sources(home, tmp_path):
    write(tmp_path, GOOD)
    inv = load_inventory()
    desk = inv.nodes["desk"]
    assert (desk.host, desk.user, desk.port, desk.nproc, desk.ifname) == ("192.168.1.11", "aura", 2222, 2, "enp3s0")
    assert desk.sources["host"] == "inventory" and desk.sources["user"] == "defaults"
    assert inv.nodes["laptop1"].sources["port"] == "built-in"
    assert desk.known_hosts == [str(home / ".ssh" / "known_hosts")]
    # the inventory's master goes first whatever the order of --nodes
    assert [n.name for n in inv.select("laptop1,desk")] == ["desk", "laptop1"]
    assert [n.name for n in inv.select(None)] == ["desk", "laptop1"]


def test_env_and_explicit_paths(home, tmp_path, monkeypatch):
    p = write(tmp_path, GOOD, "elsewhere.toml")
    monkeypatch.setenv("HRMCTL_INVENTORY", str(p))
    assert load_inventory().path == p
    with pytest.raises(InventoryError, match="does not exist"):
        load_inventory(tmp_path / "missing.toml")


def test_ssh_config_name(home, tmp_path):
    (home / ".ssh" / "config").write_text(
        "Host gpubox\n  HostName 10.0.0.7\n  User bob\n  Port 2200\n  IdentityFile ~/.ssh/gpu_key\n"
        "  UserKnownHostsFile ~/.ssh/kh_gpu\n")
    inv = load_inventory()
    node = inv.resolve("gpubox")
    assert (node.host, node.user, node.port) == ("10.0.0.7", "bob", 2200)
    assert node.identity_file == [str(home / ".ssh" / "gpu_key")]
    assert node.known_hosts == [str(home / ".ssh" / "kh_gpu")]
    assert node.sources["host"] == "ssh config"
    with pytest.raises(InventoryError, match="unknown node 'gpubx'.*did you mean 'gpubox'"):
        inv.resolve("gpubx")


def test_localhost_without_inventory(home):
    nodes = load_inventory().select(None)
    assert len(nodes) == 1 and nodes[0].is_local and nodes[0].python == sys.executable


@pytest.mark.parametrize("text,pattern", [
    ("[nodes.a]\nhost = \"x\"\nport = \n", r"not valid TOML: .*line 3"),
    ("[nodes.a]\nhots = \"x\"\n", r"unknown key 'hots' in \[nodes.a\]; did you mean 'host'"),
    ("[defaults]\nworkdri = \"x\"\n", r"unknown key 'workdri' in \[defaults\]; did you mean 'workdir'"),
    ("[nodes.a]\nuser = \"x\"\n", r"node 'a' has no host"),
    ("[nodes.a]\nhost = \"x\"\nport = 70000\n", r"port 70000 is not a number from 1 to 65535"),
    ("[nodes.a]\nhost = \"x\"\nport = \"ssh\"\n", r"port 'ssh' is not a number"),
    ("[nodes.a]\nhost = \"x\"\nnproc = 0\n", r"nproc 0 must be \"auto\" or a whole number"),
    ("[nodes.a]\nhost = \"x\"\nidentity_file = \"~/.ssh/nope\"\n", r"identity_file .*nope does not exist"),
    ("master = \"b\"\n[nodes.a]\nhost = \"x\"\n", r"master = 'b' is not a node"),
])
def test_bad_inventory(home, tmp_path, text, pattern):
    write(tmp_path, text)
    with pytest.raises(InventoryError, match=pattern):
        load_inventory()


@pytest.mark.parametrize("spec,pattern", [
    ("", r"empty name"),
    ("laptop1,,desk", r"empty name"),
    ("desk,desk", r"named twice"),
    ("lapto1", r"unknown node 'lapto1'.*did you mean 'laptop1'"),
])
def test_bad_node_selection(home, tmp_path, spec, pattern):
    write(tmp_path, GOOD)
    with pytest.raises(InventoryError, match=pattern):
        load_inventory().select(spec)


def run_cli(*args, cwd, home):
    env = dict(os.environ, HOME=str(home))
    env.pop("HRMCTL_INVENTORY", None)
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=60)


def test_cli_bad_input_is_one_line(home, tmp_path):
    write(tmp_path, "[nodes.a]\nhots = \"x\"\n")
    res = run_cli("nodes", cwd=tmp_path, home=home)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ") and "did you mean 'host'" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    write(tmp_path, GOOD)
    res = run_cli("nodes", "--nodes", "desk,desk", cwd=tmp_path, home=home)
    assert res.returncode == 2 and "named twice" in res.stderr and res.stderr.count("\n") == 1


def test_cli_nodes_json_and_version(home, tmp_path):
    write(tmp_path, GOOD)
    res = run_cli("nodes", "--json", cwd=tmp_path, home=home)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["master"] == "desk" and [n["name"] for n in doc["nodes"]] == ["desk", "laptop1"]
    assert doc["nodes"][0]["sources"]["ifname"] == "inventory"
    res = run_cli("--version", cwd=tmp_path, home=home)
    assert res.returncode == 0 and res.stdout.startswith("hrmctl ")


def test_command_line_quotes_everything():
    line = command_line(["python", "-c", "print('x'); import os", "~/data dir", "$HOME"], cwd="~/my proj",
                        env={"A": "b c", "GLOO_SOCKET_IFNAME": "wlan0"})
    assert line == ("cd \"$HOME\"/'my proj' && exec env 'A=b c' GLOO_SOCKET_IFNAME=wlan0 python -c "
                    "'print('\"'\"'x'\"'\"'); import os' \"$HOME\"/'data dir' '$HOME'")
    out = subprocess.run(["sh", "-c", command_line(["printf", "%s|", "a;b", "$(id)", "~/x"])],
                         capture_output=True, text=True, env={"HOME": "/h", "PATH": os.environ["PATH"]}).stdout
    assert out == "a;b|$(id)|/h/x|"


@pytest.mark.parametrize("args,pattern", [
    (("nodes", "--bogus"), "No such option: --bogus (see `hrmctl nodes --help`)"),
    (("nosuchcmd",), "No such command 'nosuchcmd'"),
    (("train", "--max-restarts", "-1"), "--max-restarts"),
    (("doctor", "--master-port", "x"), "--master-port"),
    (("sync-data", "node0", "--stall-timeout", "0"), "--stall-timeout"),
])
def test_cli_usage_errors_are_one_line(home, tmp_path, args, pattern):
    res = run_cli(*args, cwd=tmp_path, home=home)
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and pattern in res.stderr
    assert "Traceback" not in res.stderr
