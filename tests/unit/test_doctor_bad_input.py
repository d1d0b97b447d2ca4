"""`hrmctl doctor` bad input: one `error:` line naming the problem and the fix, non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(*args, cwd):
    p = subprocess.run([sys.executable, "-m", "cli", "doctor", *args], capture_output=True, text=True, cwd=cwd,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args,expect", [
    (["--master-port", "70000"], "--master-port 70000 is outside 1-65535"),
    (["--master-port", "0"], "--master-port 0 is outside 1-65535"),
    (["--timeout", "0"], "--timeout 0 must be a positive number"),
    (["--nodes", "nodeX"], "unknown node 'nodeX'"),
    (["--nodes", "a,,b"], "has an empty name"),
])
def test_bad_input_is_one_error_line(tmp_path, args, expect):
    code, out, err = run(*args, cwd=tmp_path)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], err
    assert "Traceback" not in out + err
