"""node.ship.program(name): the one bootstrap that carries node/ to a node's Python, and node.main, the one dispatch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import node
from node import lines
from node.ship import program, sources

HIDE = ("class Hide:\n    def find_spec(self, name, *a):\n"
        "        if name.split('.')[0] in ('node', 'netcheck', 'cli', 'auralm'): raise ImportError(name)\n"
        "import sys\nsys.meta_path.insert(0, Hide())\n")


def test_every_program_is_sent_and_the_bootstrap_fits_one_command_line_argument():
    sent = sources()
    shipped = [p for p in node.PROGRAMS if p != "torchrun"]  # torchrun runs from the node's checkout
    assert {f"node.{p}" for p in shipped} | {"node", "node.lines", "node.cgroups"} <= set(sent)
    assert not {"node.ship", "node.__main__", "node.torchrun"} & set(sent)
    for name in shipped:
        source = program(name)
        assert source.startswith(f"# hrmctl-node {name}:") and len(source.encode()) < 128 * 1024 // 2
    for name in ("nope", "torchrun"):
        with pytest.raises(ValueError, match="no node program"):
            program(name)


def test_the_bootstrap_runs_its_program_where_the_project_is_not_importable(tmp_path):
    """What a node runs: the bootstrap on stdin, the project's packages unreachable (and a node/ of another commit in
    the working directory not read): the peer agent says it is ready, answers a clock request, a listen and garbage,
    every line one JSON object (node/lines.py)."""
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "__init__.py").write_text("raise SystemExit('the node checkout was read')\n")
    code = HIDE + f"exec(compile({program('peer')!r}, '<peer>', 'exec'))\n"
    res = subprocess.run([sys.executable, "-c", code], input='{"op":"t"}\n{"op":"listen","ports":[0]}\nnot json\n',
                         capture_output=True, text=True, cwd=tmp_path, timeout=30)
    out = [lines.decode(line) for line in res.stdout.splitlines()]
    assert res.returncode == 0 and out[0] == {"ready": "peer"}, res.stderr
    assert out[1]["t"] > 0 and out[2]["listening"][0]["port"] > 0 and "error" in out[3]


def test_one_dispatch_from_a_checkout():
    res = subprocess.run([sys.executable, "-m", "node", "setup", "facts", json.dumps({"workdir": "/nonexistent/w",
                          "venv": "/nonexistent/v"})], capture_output=True, text=True, timeout=30)
    answer = lines.last(res.stdout)
    assert res.returncode == 0 and answer["ok"] and answer["python"], res.stderr
    res = subprocess.run([sys.executable, "-m", "node", "nope"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "usage: python -m node" in res.stderr


def test_lines_decode_only_json_objects():
    assert lines.decode('{"a":1}') == {"a": 1} and lines.decode(lines.encode({"b": [1]})) == {"b": [1]}
    assert lines.decode(".") is None and lines.decode("[1]") is None and lines.decode("ready") is None
    assert lines.last('banner\n{"x":1}\nstep y\n{"ok":true}\n\n') == {"ok": True} and lines.last("nothing") is None
