"""Fuzzing load_inventory (hypothesis): whatever the file holds, the outcome is a loaded inventory or
one InventoryError line that names the file; never another exception, never a hang.

Valid inventories are generated, then mutated (a value swapped for another type, random text with NUL,
newlines and spaces, nested tables where a scalar belongs, huge and negative numbers, empty strings,
random keys and node names, a missing host), and random bytes and TOML-like text are tried too.
Deterministic: derandomize=True and no example database, so CI runs the same ~400 examples each time.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cli.errors import InventoryError
from cli.nodes.inventory import Inventory, load_inventory

settings.register_profile(
    "inventory-fuzz", derandomize=True, database=None, deadline=1000, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("inventory-fuzz")

NODE_KEYS = ("host", "user", "port", "identity_file", "python", "workdir", "data_dir", "nproc", "ifname",
             "known_hosts")
SSH_CONFIG = "Host *.lan\n  User bob\n  Port 2200\nHost jump\n  HostName 10.0.0.1\n  UserKnownHostsFile ~/kh1 ~/kh2\n"


@pytest.fixture(scope="module")
def inventory_file(tmp_path_factory):
    """A home with an ssh config and a key; the file each example writes."""
    root = tmp_path_factory.mktemp("fuzz")
    home = root / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(SSH_CONFIG)
    (home / ".ssh" / "id_test").write_text("not a real key\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.delenv("HRMCTL_INVENTORY", raising=False)
        yield root / "hrmctl.toml"


# --- TOML out of Python values (tomllib reads TOML but does not write it) ---------------------------

def _string(s: str) -> str:
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or c == "\x7f":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return _string(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_string(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def dump(doc: dict, prefix: str = "") -> str:
    """A document as TOML: scalars first, then one [table] per dict (nested ones as [a."b"])."""
    lines = [f"{_string(k)} = {_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            name = f"{prefix}.{_string(k)}" if prefix else _string(k)
            lines.append(f"[{name}]")
            lines.append(dump(v, name))
    return "\n".join(lines) + "\n"


# --- strategies ----------------------------------------------------------------------------------

NAME = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,11}\Z")
HOSTS = st.one_of(st.from_regex(r"\A[a-z0-9][a-z0-9.-]{0,20}\Z"), st.just("box.lan"), st.just("jump"),
                  st.just("localhost"), st.just("192.168.1.10"), st.just("fe80::1%eth0"))
PATH = st.one_of(st.sampled_from(["~/Aura_dev", "data", "/srv/my data"]), st.from_regex(r"\A~?/?[\w. /-]{1,20}\Z"))
VALID = {
    "host": HOSTS,
    "user": st.from_regex(r"\A[a-z_][a-z0-9_-]{0,10}\Z"),
    "port": st.integers(1, 65535),
    "identity_file": st.sampled_from(["~/.ssh/id_test", ["~/.ssh/id_test"], []]),
    "python": st.sampled_from(["python3", "~/venv/bin/python", "/usr/bin/python3"]),
    "workdir": PATH,
    "data_dir": PATH,
    "nproc": st.one_of(st.just("auto"), st.integers(1, 64)),
    "ifname": st.from_regex(r"\A[a-z][a-z0-9]{0,6}\Z"),
    "known_hosts": st.one_of(PATH, st.lists(PATH, max_size=2)),
}

# text with what breaks lines, shells and messages: NUL, newlines, spaces, escapes, quotes, brackets
NASTY = st.lists(st.one_of(st.characters(codec="utf-8"), st.sampled_from(
    list("\x00\n\r\t \x1b\x7f\x85\u2028\"'\\[]{}=#.-~$%@") + ["auto", "eth0", "host"])), max_size=30).map("".join)
SCALARS = st.one_of(
    NASTY, st.just(""), st.just("auto"), st.booleans(),
    st.integers(), st.integers(-(2**70), -1), st.integers(2**63, 2**200), st.sampled_from([0, 65536, 70000, -3]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.dates(), st.datetimes(), st.times(),
)
WILD = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(NASTY, st.sampled_from(NODE_KEYS)), inner, max_size=3)),
    max_leaves=8)


@st.composite
def node_table(draw, with_host=True):
    keys = draw(st.lists(st.sampled_from(NODE_KEYS), unique=True, max_size=6))
    if with_host and "host" not in keys:
        keys.append("host")
    return {k: draw(VALID[k]) for k in keys}


@st.composite
def valid_inventory(draw):
    names = draw(st.lists(NAME, min_size=1, max_size=4, unique=True))
    doc: dict = {}
    if draw(st.booleans()):
        doc["master"] = draw(st.sampled_from(names))
    if draw(st.booleans()):
        doc["known_hosts"] = draw(VALID["known_hosts"])
    if draw(st.booleans()):
        doc["defaults"] = draw(node_table(with_host=False))
    doc["nodes"] = {n: draw(node_table()) for n in names}
    return doc


@st.composite
def mutated_inventory(draw):
    """A valid inventory with one to three things broken."""
    doc = draw(valid_inventory())
    for _ in range(draw(st.integers(1, 3))):
        nodes = doc.get("nodes") if isinstance(doc.get("nodes"), dict) else {}
        tables = ([doc["defaults"]] if isinstance(doc.get("defaults"), dict) else []) + [
            t for t in nodes.values() if isinstance(t, dict)]
        if not tables or draw(st.integers(0, 5)) == 0:   # mostly a node's table, sometimes the top level
            tables.append(doc)
        table = draw(st.sampled_from(tables))
        how = draw(st.sampled_from(["value"] * 4 + ["swap"] * 2 + ["key", "drop", "rename", "master", "table"]))
        if how == "value" and table:                     # any value becomes something wild
            table[draw(st.sampled_from(sorted(table)))] = draw(WILD)
        elif how == "swap" and table:                    # a valid value of another key
            other = draw(st.sampled_from(NODE_KEYS))
            table[draw(st.sampled_from(sorted(table)))] = draw(VALID[other])
        elif how == "key":                               # a random or misspelt key
            key = draw(st.one_of(NASTY, st.sampled_from(["hots", "prot", "nprocs", "defualts", "node", "masters"])))
            table[key] = draw(st.one_of(SCALARS, WILD))
        elif how == "drop" and table:
            del table[draw(st.sampled_from(sorted(table)))]
        elif how == "rename" and isinstance(doc.get("nodes"), dict) and doc["nodes"]:
            old = draw(st.sampled_from(sorted(doc["nodes"])))
            doc["nodes"][draw(NASTY)] = doc["nodes"].pop(old)
        elif how == "master":
            doc["master"] = draw(st.one_of(NASTY, SCALARS))
        elif how == "table":                             # a table where a scalar belongs, or the reverse
            key = draw(st.sampled_from(["defaults", "nodes", "known_hosts", "master"]))
            doc[key] = draw(st.one_of(SCALARS, st.dictionaries(NASTY, WILD, max_size=2)))
    return doc


@st.composite
def mangled_bytes(draw):
    """A valid inventory's TOML with bytes flipped, cut, duplicated or inserted."""
    raw = bytearray(dump(draw(valid_inventory())).encode())
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["flip", "cut", "insert", "dup"]))
        if op == "flip" and i < len(raw):
            raw[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del raw[i:i + draw(st.integers(1, 20))]
        elif op == "insert":
            raw[i:i] = draw(st.one_of(st.binary(max_size=8), st.sampled_from(
                [b"[", b"]", b"=", b'"', b"\n", b"[nodes]\n", b"[[nodes]]\n", b"\x00", b"\xff", b"'''", b"#"])))
        else:
            raw[i:i] = raw[max(0, i - 30):i]
    return bytes(raw)


TOMLISH = st.lists(st.sampled_from(list("[]{}=\"'.,#\n \t-_:+0123456789") + list(NODE_KEYS) +
                                   ["nodes", "defaults", "master", "a", "true", "inf", "nan", "\\u0000"]),
                   max_size=60).map("".join)


# --- the property --------------------------------------------------------------------------------

def check_outcome(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        inv = load_inventory(path)
    except InventoryError as exc:
        msg = str(exc)
        assert msg and "\n" not in msg and len(msg.splitlines()) == 1, repr(msg)
        assert msg.startswith(f"{path}: "), msg
        assert exc.exit_code == 2
        rest = msg[len(f"{path}: "):]
        rest = re.sub(r"^\[nodes\.[^\]]*\]", "[nodes.*]", rest)
        event("error: " + (rest.split(":")[0] if rest.startswith("not valid TOML") else " ".join(rest.split()[:2])))
        return
    event("loaded")
    assert isinstance(inv, Inventory)
    for name, node in inv.nodes.items():
        assert re.fullmatch(r"[A-Za-z0-9_.-]+", name)
        assert isinstance(node.port, int) and 1 <= node.port <= 65535
        assert node.nproc == "auto" or (isinstance(node.nproc, int) and node.nproc >= 1)
        assert isinstance(node.host, str) and node.host and not any(c.isspace() for c in node.host)
        assert node.ifname is None or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}", node.ifname)
        assert all(isinstance(p, str) for p in node.identity_file + node.known_hosts)
    assert inv.master is None or inv.master in inv.nodes
    json.dumps([n.as_dict() for n in inv.select(None)])   # what `hrmctl nodes --json` prints


@pytest.mark.timeout(60)
@settings(FUZZ, max_examples=40)
@given(doc=valid_inventory())
def test_valid_inventories_load(inventory_file, doc):
    inventory_file.write_text(dump(doc), encoding="utf-8")
    inv = load_inventory(inventory_file)                  # no error at all
    assert list(inv.nodes) == list(doc["nodes"]) and inv.master == doc.get("master")
    for name, table in doc["nodes"].items():
        for key, value in table.items():
            if not (key == "known_hosts" and value == []):  # an empty list: the built-in ~/.ssh/known_hosts
                assert inv.nodes[name].sources[key] == "inventory"
            if key in ("port", "nproc", "host", "ifname", "python", "workdir", "data_dir", "user"):
                assert getattr(inv.nodes[name], key) == value
    check_outcome(inventory_file, dump(doc).encode())


@pytest.mark.timeout(60)
@settings(FUZZ, max_examples=220)
@given(doc=mutated_inventory())
def test_mutated_inventories(inventory_file, doc):
    check_outcome(inventory_file, dump(doc).encode())


@pytest.mark.timeout(60)
@settings(FUZZ, max_examples=80)
@given(data=st.one_of(mangled_bytes(), st.binary(max_size=200), st.integers(1, 3000).map(
    lambda n: b"[nodes.a]\nhost = " + b"[" * n + b"]" * n)))
def test_random_bytes(inventory_file, data):
    check_outcome(inventory_file, data)


@pytest.mark.timeout(60)
@settings(FUZZ, max_examples=80)
@given(text=TOMLISH)
def test_tomlish_text(inventory_file, text):
    check_outcome(inventory_file, text.encode())
