"""Inventory resolution and every bad input named in the ground issue: one line, non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing

import msgspec
import pytest

from cli.errors import InventoryError
from cli.nodes import schema
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


def test_threads_from_defaults_a_nodes_own_or_none(home, tmp_path):
    write(tmp_path, '[defaults]\nthreads = 2\n[nodes.a]\nhost = "x"\nthreads = 1\n[nodes.b]\nhost = "y"\n'
                    '[nodes.c]\nhost = "z"\n')
    nodes = load_inventory().nodes
    assert (nodes["a"].threads, nodes["b"].threads) == (1, 2) and nodes["a"].sources["threads"] == "inventory"
    write(tmp_path, '[nodes.a]\nhost = "x"\n')
    assert load_inventory().nodes["a"].threads is None  # the launcher's own choice


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
    ("[nodes.a]\nuser = \"x\"\n", r"node 'a' has no host"),
    ("[nodes.a]\nhost = \"x\"\nidentity_file = \"~/.ssh/nope\"\n", r"identity_file .*nope does not exist"),
])
def test_bad_inventory(home, tmp_path, text, pattern):
    write(tmp_path, text)
    with pytest.raises(InventoryError, match=pattern):
        load_inventory()


HOST = "a host name or address (no spaces or control characters, not starting with '-')"
PATHS = "a path, or a list of paths (non-empty text without control characters)"
IFNAME = "a network interface name like \"eth0\" (1-15 ASCII letters, digits, '_', '.', ':', '-')"


# (the file's text, the whole message after "<file>: "): one per kind of mistake named in issue #15
@pytest.mark.parametrize("text,message", [
    # wrong types and values: the table, the key, what it must be, what it was
    ("[nodes.a]\nhost = \"x\"\nuser = 7\n",
     "[nodes.a] user must be a user name (no spaces or control characters, not starting with '-'), not 7"),
    ("[nodes.a]\nhost = \"x\"\nworkdir = {x = 1}\n",
     "[nodes.a] workdir must be a non-empty path without control characters, not a table"),
    ("[nodes.a]\nhost = \"x\"\nnproc = -3\n", "[nodes.a] nproc must be \"auto\" or an integer >= 1, not -3"),
    ("[nodes.a]\nhost = \"x\"\nnproc = 0\n", "[nodes.a] nproc must be \"auto\" or an integer >= 1, not 0"),
    ("[nodes.a]\nhost = \"x\"\nthreads = 0\n", "[nodes.a] threads must be an integer >= 1, not 0"),
    ("[defaults]\nthreads = \"2\"\n[nodes.a]\nhost = \"x\"\n", "[defaults] threads must be an integer >= 1, not '2'"),
    ("[nodes.a]\nhost = \"x\"\nnproc = \"Auto\"\n", "[nodes.a] nproc must be \"auto\" or an integer >= 1, not 'Auto'"),
    ("[nodes.a]\nhost = \"x\"\nport = 70000\n", "[nodes.a] port must be an integer from 1 to 65535, not 70000"),
    ("[nodes.a]\nhost = \"x\"\nport = \"ssh\"\n", "[nodes.a] port must be an integer from 1 to 65535, not 'ssh'"),
    ("[nodes.a]\nhost = \"x\"\nport = true\n", "[nodes.a] port must be an integer from 1 to 65535, not true"),
    ("[defaults]\nport = 22.5\n", "[defaults] port must be an integer from 1 to 65535, not 22.5"),
    ("[nodes.a]\nhost = \"x\"\nport = 99999999999999999999999\n",
     "[nodes.a] port must be an integer from 1 to 65535, not a huge number"),
    ("[nodes.a]\nhost = \"a\\u0000b\"\n", f"[nodes.a] host must be {HOST}, not 'a\\x00b'"),
    ("[nodes.a]\nhost = \"a\\u001bb\"\n", f"[nodes.a] host must be {HOST}, not 'a\\x1bb'"),
    ("[nodes.a]\nhost = \"a\\nb\"\n", f"[nodes.a] host must be {HOST}, not 'a\\nb'"),
    ("[nodes.a]\nhost = \"x\\n\"\n", f"[nodes.a] host must be {HOST}, not 'x\\n'"),
    ("[nodes.a]\nhost = \"my laptop\"\n", f"[nodes.a] host must be {HOST}, not 'my laptop'"),
    ("[nodes.a]\nhost = \"\"\n", f"[nodes.a] host must be {HOST}, not ''"),
    ("[nodes.a]\nhost = \"-oProxyCommand=sh\"\n", f"[nodes.a] host must be {HOST}, not '-oProxyCommand=sh'"),
    ("[nodes.\"gpu.box\"]\nhost = \"x\"\nport = 0\n",
     "[nodes.\"gpu.box\"] port must be an integer from 1 to 65535, not 0"),
    ("[nodes.a]\nhost = \"x\"\nknown_hosts = 5\n", f"[nodes.a] known_hosts must be {PATHS}, not 5"),
    ("[nodes.a]\nhost = \"x\"\nknown_hosts = {f = \"x\"}\n", f"[nodes.a] known_hosts must be {PATHS}, not a table"),
    ("[nodes.a]\nhost = \"x\"\nknown_hosts = \"\"\n", f"[nodes.a] known_hosts must be {PATHS}, not ''"),
    ("[nodes.a]\nhost = \"x\"\nknown_hosts = [\"/a\", 5]\n",
     "[nodes.a] known_hosts[1] must be a non-empty path without control characters, not 5"),
    ("known_hosts = false\n", f"known_hosts must be {PATHS}, not false"),
    ("[nodes.a]\nhost = \"x\"\nifname = \"eth0; reboot\"\n", f"[nodes.a] ifname must be {IFNAME}, not 'eth0; reboot'"),
    ("[nodes.a]\nhost = \"x\"\nifname = \"enp3s0-and-then-more\"\n",
     f"[nodes.a] ifname must be {IFNAME}, not 'enp3s0-and-then-more'"),
    ("[nodes.a]\nhost = \"x\"\nifname = 0\n", f"[nodes.a] ifname must be {IFNAME}, not 0"),
    ("[nodes.a]\nhost = \"x\"\npython = 1979-05-27\n",
     "[nodes.a] python must be a command or path (non-empty text without control characters), not a date/time"),
    # node names, and the tables themselves
    ("[nodes.\"my laptop\"]\nhost = \"x\"\n",
     "node name 'my laptop' in [nodes] must be ASCII letters, digits, '-', '_' and '.' only; rename that table"),
    ("[nodes.\"\"]\nhost = \"x\"\n",
     "node name '' in [nodes] must be ASCII letters, digits, '-', '_' and '.' only; rename that table"),
    ("[nodes]\na = 5\n", "[nodes.a] must be a table, not 5; see the README's inventory example"),
    ("nodes = [1]\n", "nodes must be a table of nodes like [nodes.NAME], not an array"),
    ("defaults = \"x\"\n", "defaults must be a table, not 'x'"),
    # master
    ("master = \"b\"\n[nodes.a]\nhost = \"x\"\n", "master = 'b' is not a node of this inventory; nodes: a"),
    ("master = \"dsk\"\n[nodes.desk]\nhost = \"x\"\n",
     "master = 'dsk' is not a node of this inventory; did you mean 'desk'?"),
    ("master = 3\n[nodes.a]\nhost = \"x\"\n", "master must be the name of a node of this inventory, not 3"),
    # unknown keys keep the nearest valid one
    ("[nodes.a]\nhots = \"x\"\n", "unknown key 'hots' in [nodes.a]; did you mean 'host'?"),
    ("[defaults]\nworkdri = \"x\"\n", "unknown key 'workdri' in [defaults]; did you mean 'workdir'?"),
    ("mastr = \"a\"\n", "unknown key 'mastr' in the top level; did you mean 'master'?"),
    ("\"a\\nb\" = 1\n", "unknown key 'a\\nb' in the top level; valid keys: master, known_hosts, defaults, nodes, slurm"),
    # not TOML at all: the parser's own words, with the line and column
    ("[nodes.a]\nhost = \"x\"\nport = \n", "not valid TOML: Invalid value (at line 3, column 8); fix that line"),
    ("[nodes.a]\nhost = \"x\n", "not valid TOML: Illegal character '\\n' (at line 2, column 10); fix that line"),
    ("[nodes.a]\nhost = \"x",
     "not valid TOML: Unterminated string (at end of document, line 2, column 10); fix that line"),
    ("a = " + "[" * 5000, "not valid TOML for hrmctl: arrays or tables nested too deeply"),
])
def test_bad_inventory_one_line(home, tmp_path, text, message):
    p = write(tmp_path, text)
    with pytest.raises(InventoryError) as err:
        load_inventory()
    assert str(err.value) == f"{p}: {message}"
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_valid_values_at_the_edges(home, tmp_path):
    write(tmp_path, "known_hosts = \"~/kh\"\n[defaults]\nidentity_file = []\nport = 65535\n"
                    "[nodes.\"gpu-1.lan_x\"]\nhost = \"fe80::1%eth0\"\nport = 1\nnproc = 1\nifname = \"eth0.100\"\n"
                    "[nodes.b]\nhost = \"b\"\nknown_hosts = [\"/a\", \"/b c\"]\nworkdir = \"~/my proj\"\n")
    inv = load_inventory()
    a, b = inv.nodes["gpu-1.lan_x"], inv.nodes["b"]
    assert (a.host, a.port, a.nproc, a.ifname) == ("fe80::1%eth0", 1, 1, "eth0.100")
    assert a.known_hosts == [str(home / "kh")] and a.sources["known_hosts"] == "inventory"
    assert a.identity_file == [] and a.sources["identity_file"] == "defaults"
    assert (b.port, b.sources["port"], b.known_hosts, b.workdir) == (65535, "defaults", ["/a", "/b c"], "~/my proj")


def test_ssh_config_port_is_checked(home, tmp_path):
    (home / ".ssh" / "config").write_text("Host box\n  Port ssh\n")
    with pytest.raises(InventoryError) as err:
        load_inventory().resolve("box")
    assert str(err.value) == ("inventory: node 'box': port 'ssh' from ~/.ssh/config must be an integer "
                              "from 1 to 65535; fix it there")


def _members(tp):
    """Every type inside `tp` (through Union, Annotated, list, dict)."""
    yield tp
    for arg in typing.get_args(tp):
        if not isinstance(arg, (str, int, msgspec.Meta)):
            yield from _members(arg)


def test_schema_keeps_patterns_out_of_unions_with_containers():
    """msgspec <= 0.22 crashes the process at exit (garbage collection) for a pattern-checked str in a
    Union with a list/dict/set/tuple: see cli/nodes/schema.py, Paths."""
    def has_pattern(t):
        return typing.get_origin(t) is typing.Annotated and any(
            isinstance(m, msgspec.Meta) and m.pattern for m in t.__metadata__)

    def container(t):
        base = typing.get_args(t)[0] if typing.get_origin(t) is typing.Annotated else t
        return (typing.get_origin(base) or base) in (list, dict, set, frozenset, tuple)

    for struct in (schema.NodeTable, schema.TopTable):
        for field in msgspec.structs.fields(struct):
            for t in _members(field.type):
                if typing.get_origin(t) is typing.Union:
                    arms = typing.get_args(t)
                    assert not (any(map(has_pattern, arms)) and any(map(container, arms))), (struct, field.name)


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


@pytest.mark.parametrize("text,part", [
    ("[nodes.a]\nhost = \"x\"\nnproc = -3\n", "[nodes.a] nproc must be \"auto\" or an integer >= 1, not -3"),
    ("[nodes.a]\nhost = \"x\"\nport = \n", "not valid TOML: Invalid value (at line 3, column 8); fix that line"),
    ("[nodes.\"my laptop\"]\nhost = \"x\"\n", "node name 'my laptop' in [nodes] must be ASCII letters"),
])
def test_cli_bad_inventory_exit_2_one_line(home, tmp_path, text, part):
    p = write(tmp_path, text, "custom.toml")
    res = run_cli("nodes", "--inventory", str(p), cwd=tmp_path, home=home)
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"error: {p}: {part}")
    assert res.stderr.count("\n") == 1 and res.stderr.endswith("\n")
    assert "Traceback" not in res.stderr + res.stdout


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


def test_nodes_table_shows_a_value_with_brackets_as_written(home, tmp_path):
    """A value that looks like rich markup (`[/dim]`) is text: shown as written, never a MarkupError."""
    write(tmp_path, '[nodes.a]\nhost = "10.0.0.1"\nworkdir = "~/[/dim]x[bold]"\n')
    res = run_cli("nodes", cwd=tmp_path, home=home)
    assert res.returncode == 0, res.stderr
    assert "~/[/dim]x[bold] (inventory)" in res.stdout
