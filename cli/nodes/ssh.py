"""A node reached over SSH (paramiko): its session, the jobs and pipes it starts, host-key policies. The interface
(Session, Job, Pipe, Result) and the way to get a session (`connect`) are cli/nodes/remote.py's, which imports this
module only when an SSH node is connected."""

from __future__ import annotations

import logging
import os
import shlex
import socket
import threading
import time
from pathlib import Path

import paramiko

from cli.errors import AuthError, HostKeyError, RemoteTimeout, UnreachableError
from cli.nodes.inventory import Node
from cli.nodes.remote import (CONNECT_TIMEOUT, Job, LineHandler, Pipe, Result, Session, _pump_lines,
                              command_line)

# paramiko logs a failed handshake with its traceback at ERROR; with no handler configured,
# Python's last-resort handler would print that on stderr next to our one-line error.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

KEEPALIVE_S = 5
EOF_GRACE_S = 2.0  # after a command's exit status, how long to wait for the rest of its output


class SSHJob(Job):
    def __init__(self, chan: paramiko.Channel, on_line: LineHandler):
        self.chan = chan
        self.threads = [
            threading.Thread(target=_pump_lines, args=(lambda: chan.recv(65536), "stdout", on_line), daemon=True),
            threading.Thread(target=_pump_lines, args=(lambda: chan.recv_stderr(65536), "stderr", on_line),
                             daemon=True),
        ]
        for t in self.threads:
            t.start()

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.chan.status_event.wait(timeout):
            if self.chan.closed or not self.chan.get_transport() or not self.chan.get_transport().is_active():
                return 255
            return None
        for t in self.threads:
            t.join(5)
        return self.chan.recv_exit_status()

    def connection_lost(self) -> bool:
        transport = self.chan.get_transport()
        return not self.chan.status_event.is_set() and (transport is None or not transport.is_active())

    def stop(self) -> None:
        try:
            self.chan.close()
        except Exception:
            pass


class SSHPipe(Pipe):
    def __init__(self, chan: paramiko.Channel):
        super().__init__()
        self.chan = chan

    def send(self, data: str | bytes, timeout: float | None = None) -> None:
        if timeout is not None:
            self.chan.settimeout(timeout)
        self.chan.sendall(data.encode() if isinstance(data, str) else data)

    def _recv(self, timeout: float) -> bytes | None:
        self.chan.settimeout(timeout)
        try:
            return self.chan.recv(65536)
        except socket.timeout:
            return None

    def close(self) -> None:
        try:
            self.chan.shutdown_write()
            self.chan.close()
        except Exception:
            pass


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's StrictHostKeyChecking=accept-new: record an unknown key, never a changed one."""

    def __init__(self, path: str):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        client.get_host_keys().add(hostname, key.get_name(), key)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class _RefusePolicy(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise _UnknownHostKey(hostname, key)


class _UnknownHostKey(Exception):
    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


# AES-GCM first: hardware-accelerated, one pass for encryption and integrity (paramiko's default,
# aes128-ctr + hmac-sha2-256, moves bulk data about 1.5x slower). Other ciphers stay as fallbacks.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _transport(sock, **kwargs) -> paramiko.Transport:
    transport = paramiko.Transport(sock, **kwargs)
    opts = transport.get_security_options()
    first = tuple(c for c in PREFERRED_CIPHERS if c in opts.ciphers)
    opts.ciphers = first + tuple(c for c in opts.ciphers if c not in first)
    return transport


class _PromptSocket(socket.socket):
    """A TCP socket whose writes go out at once (TCP_NODELAY) and whose ACKs too (TCP_QUICKACK,
    which Linux turns off again by itself, so it is set before every read).

    Without them every SSH exchange of small messages can wait for a delayed ACK: sshd writes
    one message, Nagle holds its next one until the first is acknowledged, and this side holds
    that ACK back for up to 40 ms. Measured on the lab: connecting took 65 to 110 ms instead of
    about 22 ms, and opening the first channel 44 ms instead of 2 ms."""

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if _QUICKACK is not None:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        return super().recv(bufsize, flags)


_QUICKACK = getattr(socket, "TCP_QUICKACK", None)  # Linux (and WSL) only


def _dial(host: str, port: int, timeout: float) -> socket.socket:
    plain = socket.create_connection((host, port), timeout=timeout)
    sock = _PromptSocket(fileno=plain.detach())
    sock.settimeout(timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _fingerprint(key: paramiko.PKey) -> str:
    import base64
    import hashlib
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class SSHSession(Session):
    """A node reached over SSH with paramiko; host keys are always checked."""

    def __init__(self, node: Node, *, accept_new_host_keys: bool = False, timeout: float = CONNECT_TIMEOUT):
        self.node = node
        self.client = paramiko.SSHClient()
        self._sftp: paramiko.SFTPClient | None = None
        known = node.known_hosts[0] if node.known_hosts else os.path.expanduser("~/.ssh/known_hosts")
        for path in node.known_hosts:
            if os.path.isfile(path):
                try:
                    self.client.get_host_keys().load(path)
                except Exception as exc:
                    raise HostKeyError(f"{node.name}: cannot read known_hosts {path} ({exc}); fix or move that file") from None
        self.client.set_missing_host_key_policy(_AcceptNewPolicy(known) if accept_new_host_keys else _RefusePolicy())
        self._connect(timeout, known)

    def _connect(self, timeout: float, known: str) -> None:
        n = self.node
        target = n.host if n.port == 22 else f"[{n.host}]:{n.port}"
        try:
            if n.proxy_command:
                sock = paramiko.ProxyCommand(n.proxy_command.replace("%h", n.host).replace("%p", str(n.port)))
            else:
                sock = _dial(n.host, n.port, timeout)
            try:
                self.client.connect(
                    n.host, port=n.port, username=n.user, key_filename=n.identity_file or None,
                    timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, allow_agent=True,
                    look_for_keys=not n.identity_file, sock=sock, transport_factory=_transport,
                )
            except BaseException:
                self.client.close()
                sock.close()
                raise
        except _UnknownHostKey as exc:
            raise HostKeyError(
                f"{n.name}: unknown host key for {target} ({exc.key.get_name()} {_fingerprint(exc.key)}); "
                f"after checking that fingerprint on the node (ssh-keygen -lf /etc/ssh/ssh_host_*.pub), trust it with "
                f"`ssh-keyscan -p {n.port} {n.host} >> {known}` or rerun with --accept-new-host-keys"
            ) from None
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"{n.name}: HOST KEY CHANGED for {target}: known_hosts has {_fingerprint(exc.expected_key)}, "
                f"the node sent {_fingerprint(exc.key)} - someone may be intercepting the connection; refusing. "
                f"If the node was reinstalled, remove the old key with `ssh-keygen -R '{target}' -f {known}` and connect again"
            ) from None
        except paramiko.AuthenticationException:
            keys = ", ".join(n.identity_file) or "your agent and default keys"
            raise AuthError(
                f"{n.name}: authentication failed for {n.user}@{n.host}:{n.port} with {keys}; "
                f"check user/identity_file in the inventory or install your key with `ssh-copy-id -p {n.port} {n.user}@{n.host}`"
            ) from None
        except (socket.timeout, TimeoutError):
            raise UnreachableError(
                f"{n.name}: no answer from {n.host}:{n.port} within {timeout:g}s; is the node up, on this network, and sshd running?"
            ) from None
        except (paramiko.ssh_exception.NoValidConnectionsError, OSError, paramiko.SSHException, EOFError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise UnreachableError(
                f"{n.name}: cannot connect to {n.host}:{n.port} ({reason}); is the node up and sshd listening on that port?"
            ) from None
        transport = self.client.get_transport()
        if transport is not None:
            transport.set_keepalive(KEEPALIVE_S)

    def _open(self, line: str, pty: bool) -> paramiko.Channel:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise UnreachableError(f"{self.node.name}: the SSH connection to {self.node.host} was lost; check the node and retry")
        try:
            chan = transport.open_session(timeout=CONNECT_TIMEOUT)
            if pty:
                chan.get_pty(term="dumb", width=200)
            chan.exec_command(line)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise UnreachableError(f"{self.node.name}: cannot run a command over SSH ({exc}); check the node and retry") from None
        return chan

    def run(self, argv, *, timeout=60, input=None, env=None, cwd=None) -> Result:
        chan = self._open(command_line(argv, cwd, env), pty=False)
        try:
            if input is not None:
                chan.sendall(input.encode() if isinstance(input, str) else input)
            chan.shutdown_write()
        except OSError:  # it ended before taking all its input (no such python, say): its exit code and stderr say why
            pass
        out, err = bytearray(), bytearray()
        deadline = None if timeout is None else time.monotonic() + timeout
        exited_at = None
        while True:
            busy = False
            while chan.recv_ready():
                out += chan.recv(65536)
                busy = True
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
                busy = True
            # sshd may send the exit status before the last output: wait for EOF too (a while
            # only, in case a background child keeps the output open).
            if chan.exit_status_ready() and exited_at is None:
                exited_at = time.monotonic()
            drained = not chan.recv_ready() and not chan.recv_stderr_ready()
            if drained and (chan.closed or (chan.eof_received and exited_at is not None) or
                            (exited_at is not None and time.monotonic() - exited_at > EOF_GRACE_S)):
                break
            if deadline is not None and time.monotonic() > deadline:
                chan.close()
                raise RemoteTimeout(
                    f"{self.node.name}: `{shlex.join(argv)[:120]}` did not finish in {timeout:g}s; it was stopped"
                )
            transport = chan.get_transport()
            if transport is None or not transport.is_active():
                raise UnreachableError(f"{self.node.name}: the SSH connection was lost while running a command")
            if not busy:
                time.sleep(0.002)
        code = chan.recv_exit_status() if chan.exit_status_ready() else 255
        chan.close()
        return Result(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    def start(self, argv, on_line, *, env=None, cwd=None, pty=False) -> Job:
        chan = self._open(command_line(argv, cwd, env), pty=pty)
        chan.shutdown_write() if not pty else None
        return SSHJob(chan, on_line)

    def pipe(self, argv, *, env=None, cwd=None) -> Pipe:
        return SSHPipe(self._open(command_line(argv, cwd, env), pty=False))

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.client.open_sftp()
        return self._sftp

    @staticmethod
    def sftp_path(remote: str) -> str:
        """SFTP paths are relative to the login directory, so `~/x` is `x`."""
        if remote == "~":
            return "."
        return remote[2:] if remote.startswith("~/") else remote

    def put(self, local, remote) -> None:
        self.sftp().put(str(local), self.sftp_path(remote))

    def get(self, remote, local) -> None:
        self.sftp().get(self.sftp_path(remote), str(local))

    def close(self) -> None:
        try:
            if self._sftp is not None:
                self._sftp.close()
            self.client.close()
        except Exception:
            pass
