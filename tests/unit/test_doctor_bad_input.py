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


def test_a_port_that_is_not_sshd_is_one_line_without_paramikos_traceback(tmp_path):
    """A TCP server that accepts and hangs up at once (a port forward with nothing behind it):
    paramiko's transport thread logs the failed banner read with a traceback, which must not
    reach the user's terminal."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[bool] = []

    def accept() -> None:
        try:
            while True:
                conn = server.accept()[0]
                accepted.append(True)
                conn.close()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    (tmp_path / "hrmctl.toml").write_text(f'[nodes.notssh]\nhost = "127.0.0.1"\nport = {port}\n')
    try:
        code, out, err = run("--nodes", "notssh", "--timeout", "5", cwd=tmp_path)
    finally:
        server.close()
    assert code != 0
    assert accepted, "hrmctl never connected to the port"
    assert "Traceback" not in out + err and "paramiko" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors and "notssh" in errors[0] and str(port) in errors[0], err
