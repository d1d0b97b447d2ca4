"""What a fresh look at a lost node's sshd port tells (cli/launch/run/lost.py link_answers), against real local sockets:
an sshd that greets, a port the kernel takes but nothing answers on (every process frozen: asleep), and no listener."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

from cli.launch.run import lost


def _plan(port: int) -> SimpleNamespace:
    return SimpleNamespace(node=SimpleNamespace(host="127.0.0.1", port=port, proxy_command=None))


def test_a_greeting_sshd_answers_a_silent_one_is_asleep_and_a_closed_port_is_down(monkeypatch):
    monkeypatch.setattr(lost, "CONNECT_S", 1.0)
    with socket.socket() as greeting, socket.socket() as silent, socket.socket() as closed:
        for s in (greeting, silent, closed):
            s.bind(("127.0.0.1", 0))
        greeting.listen()
        silent.listen()  # the kernel completes the handshake; no process reads or writes: a frozen sshd

        def greet():
            conn, _ = greeting.accept()
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
            conn.close()

        t = threading.Thread(target=greet, daemon=True)
        t.start()
        assert lost.link_answers(_plan(greeting.getsockname()[1])) is None
        asleep = lost.link_answers(_plan(silent.getsockname()[1]))
        assert asleep.startswith("it is asleep or frozen (127.0.0.1:") and "says nothing within 1s" in asleep
        down = lost.link_answers(_plan(closed.getsockname()[1]))  # bound, not listening: refused
        assert down.startswith("its link is down (127.0.0.1:") and "refused" in down.lower(), down
        t.join(5)
