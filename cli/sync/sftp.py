"""A pipelined SFTP (version 3) writer over one paramiko channel, for `hrmctl sync-data`.

paramiko's SFTPClient waits for each file's open/close and caps writes at 32 KB; this client
keeps many requests in flight across many files: requests are sent without waiting, one reader
thread matches replies to requests by id and calls their callbacks. The number of bytes and
requests in flight is bounded. If the node sends no reply for `stall_timeout` seconds while
requests are outstanding (a dropped Wi-Fi link, a firewall), every wait raises SFTPStalled.

Only what sync needs: open (write), write, close, remove.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Callable

import paramiko

INIT, VERSION, OPEN, CLOSE, WRITE, REMOVE = 1, 2, 3, 4, 6, 13
STATUS, HANDLE = 101, 102
FXF_WRITE, FXF_CREAT, FXF_TRUNC = 0x02, 0x08, 0x10
STATUS_NAMES = {1: "end of file", 2: "no such file", 3: "permission denied", 4: "failure",
                5: "bad message", 6: "no connection", 7: "connection lost", 8: "unsupported"}

WRITE_SIZE = 240 * 1024      # data per WRITE request (OpenSSH's sftp-server takes messages up to 256 KB)
MAX_BYTES_IN_FLIGHT = 16 << 20
MAX_REQUESTS_IN_FLIGHT = 1024

Callback = Callable[[int, int, bytes], None]  # (reply type, status code or 0, body after id)


class SFTPError(Exception):
    """A request failed on the node (status code and message)."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{message or STATUS_NAMES.get(code, 'error')} (sftp status {code})")
        self.code = code


class SFTPStalled(Exception):
    """No reply from the node for too long, or the connection is gone."""


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _parse_status(body: bytes) -> tuple[int, str]:
    code = struct.unpack_from(">I", body, 0)[0]
    msg = b""
    if len(body) >= 8:
        n = struct.unpack_from(">I", body, 4)[0]
        msg = body[8:8 + n]
    return code, msg.decode("utf-8", "replace")


class PipelinedSFTP:
    def __init__(self, transport: paramiko.Transport, *, stall_timeout: float = 30.0):
        self.stall_timeout = stall_timeout
        self.chan = transport.open_session(timeout=stall_timeout)
        self.chan.settimeout(stall_timeout)
        self.chan.invoke_subsystem("sftp")
        # paramiko sends at most out_max_packet_size - 64 bytes of data per channel packet
        self._piece = max(4096, min(self.chan.out_max_packet_size - 64, 256 * 1024))
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._waiting: dict[int, tuple[Callback, int]] = {}
        self._bytes_in_flight = 0
        self._next_id = 1
        self._rbuf = bytearray()
        self._out = bytearray()
        self._sleepers = 0  # threads waiting on _cond (the reader notifies only if there are any)
        self._failure: str | None = None
        self.last_reply = time.monotonic()
        self._send_raw(struct.pack(">IBI", 5, INIT, 3))
        self.flush()
        kind, _ = self._read_replies()[0]
        if kind != VERSION:
            raise SFTPStalled("the node's SFTP server did not answer INIT")
        self._reader = threading.Thread(target=self._read_loop, name="sftp-reader", daemon=True)
        self._reader.start()

    # ---------------------------------------------------------------- wire
    def _read_replies(self) -> list[tuple[int, bytes]]:
        """Every complete reply that has arrived, at least one: [(type, body)].

        Partial data stays in self._rbuf (across a timeout too), so nothing is lost."""
        buf = self._rbuf
        while True:
            replies, pos, end = [], 0, len(buf)
            while end - pos >= 4:
                length = struct.unpack_from(">I", buf, pos)[0]
                if end - pos < 4 + length:
                    break
                replies.append((buf[pos + 4], bytes(buf[pos + 5:pos + 4 + length])))
                pos += 4 + length
            if pos:
                del buf[:pos]
            if replies:
                return replies
            chunk = self.chan.recv(65536)
            if not chunk:
                raise EOFError("the SFTP channel closed")
            buf += chunk

    def _send_raw(self, head: bytes, data: bytes = b"") -> None:
        """Queue one message; whole channel packets go out at once, the rest waits for flush().

        Small requests (opens, closes, small writes) share packets: one packet per request costs
        a system call and a trip through the network stack each."""
        with self._send_lock:
            self._out += head
            self._out += data
            if len(self._out) >= self._piece:
                self._flush_locked(whole_packets_only=True)

    def _flush_locked(self, whole_packets_only: bool = False) -> None:
        piece, total = self._piece, len(self._out)
        end = total - total % piece if whole_packets_only else total
        if not end:
            return
        view = memoryview(self._out)
        try:
            for start in range(0, end, piece):
                self.chan.sendall(view[start:min(start + piece, end)].tobytes())
        finally:
            view.release()
        del self._out[:end]

    def flush(self) -> None:
        """Send whatever is queued (always done before waiting for a reply)."""
        try:
            with self._send_lock:
                self._flush_locked()
        except Exception as exc:
            with self._cond:
                self._failure = f"cannot send to the node ({exc or type(exc).__name__})"
                self._cond.notify_all()
            raise SFTPStalled(self._failure) from None

    def _read_loop(self) -> None:
        try:
            while True:
                try:
                    replies = self._read_replies()
                except socket.timeout:  # silence: the waiters decide whether it is a stall
                    continue
                answered = []
                with self._cond:  # one lock round for every reply that came in together
                    self.last_reply = time.monotonic()
                    for kind, body in replies:
                        callback, nbytes = self._waiting.pop(struct.unpack_from(">I", body, 0)[0], (None, 0))
                        self._bytes_in_flight -= nbytes
                        answered.append((callback, kind, body))
                for callback, kind, body in answered:
                    if callback is not None:
                        code = struct.unpack_from(">I", body, 4)[0] if kind == STATUS else 0
                        callback(kind, code, body[4:])
                with self._cond:  # after the callbacks: a waiter's condition may hold now
                    if self._sleepers:
                        self._cond.notify_all()
        except Exception as exc:  # EOF, socket errors: everyone waiting must learn of it
            with self._cond:
                self._failure = f"the SFTP connection was lost ({exc or type(exc).__name__})"
                self._cond.notify_all()

    def stalled(self) -> bool:
        """True when the connection is lost, or requests wait and nothing came for stall_timeout."""
        with self._cond:
            return bool(self._failure) or (bool(self._waiting) and
                                           time.monotonic() - self.last_reply > self.stall_timeout)

    def _check(self) -> None:
        if self._failure:
            raise SFTPStalled(self._failure)
        if self._waiting and time.monotonic() - self.last_reply > self.stall_timeout:
            self._failure = f"no reply from the node for {self.stall_timeout:g}s"
            raise SFTPStalled(self._failure)

    def request(self, kind: int, payload: bytes, callback: Callback, data: bytes = b"") -> None:
        """Send one request (payload, then data as an SFTP string) without waiting for its reply.

        The callback runs in the reader thread.
        """
        nbytes = len(data)
        with self._cond:
            rid = None if self._full(nbytes) else self._register(callback, nbytes)
        if rid is None:  # too much in flight: send what is queued and wait for replies
            self.flush()
            with self._cond:
                while self._full(nbytes):
                    self._check()
                    self._sleepers += 1
                    self._cond.wait(0.25)
                    self._sleepers -= 1
                rid = self._register(callback, nbytes)
        try:
            if data:
                payload += struct.pack(">I", nbytes)
            self._send_raw(struct.pack(">IBI", len(payload) + 5 + nbytes, kind, rid) + payload, data)
        except Exception as exc:
            with self._cond:
                self._failure = f"cannot send to the node ({exc or type(exc).__name__})"
                self._cond.notify_all()
            raise SFTPStalled(self._failure) from None

    def _full(self, nbytes: int) -> bool:
        return bool(self._failure or len(self._waiting) >= MAX_REQUESTS_IN_FLIGHT or
                    (self._bytes_in_flight and self._bytes_in_flight + nbytes > MAX_BYTES_IN_FLIGHT))

    def _register(self, callback: Callback, nbytes: int) -> int:
        if not self._waiting:
            self.last_reply = time.monotonic()
        rid = self._next_id
        self._next_id += 1
        self._waiting[rid] = (callback, nbytes)
        self._bytes_in_flight += nbytes
        return rid

    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait until ready() (made true by a reply's callback); SFTPStalled if the node stops answering."""
        if ready():
            return
        self.flush()
        with self._cond:
            while not ready():
                self._check()
                self._sleepers += 1
                self._cond.wait(0.25)
                self._sleepers -= 1

    def call(self, kind: int, payload: bytes) -> tuple[int, bytes]:
        """Send one request and wait for its reply: (reply type, body)."""
        box: list = []
        self.request(kind, payload, lambda k, code, body: box.append((k, code, body)))
        self.wait_until(lambda: bool(box))
        k, code, body = box[0]
        if k == STATUS and code != 0:
            raise SFTPError(code, _parse_status(body)[1])
        return k, body

    def drain(self) -> None:
        """Wait until every request sent so far has its reply."""
        self.flush()
        with self._cond:
            while self._waiting:
                self._check()
                self._sleepers += 1
                self._cond.wait(0.25)
                self._sleepers -= 1
            if self._failure:
                raise SFTPStalled(self._failure)

    # ---------------------------------------------------------------- operations
    def open_write(self, path: str, *, truncate: bool, callback: Callable[[bytes | None, SFTPError | None], None]) -> None:
        """Open path for writing without waiting; callback(handle, None) or callback(None, error) follows."""
        flags = FXF_WRITE | FXF_CREAT | (FXF_TRUNC if truncate else 0)

        def got(kind: int, code: int, body: bytes) -> None:
            if kind == HANDLE:
                n = struct.unpack_from(">I", body, 0)[0]
                callback(body[4:4 + n], None)
            else:
                callback(None, SFTPError(code or 5, _parse_status(body)[1] if kind == STATUS else "no handle"))

        self.request(OPEN, _string(os.fsencode(path)) + struct.pack(">II", flags, 0), got)

    def write(self, handle: bytes, offset: int, data: bytes, callback: Callback) -> None:
        self.request(WRITE, _string(handle) + struct.pack(">Q", offset), callback, data=data)

    def close_handle(self, handle: bytes, callback: Callback) -> None:
        self.request(CLOSE, _string(handle), callback)

    def remove(self, path: str) -> None:
        try:
            self.call(REMOVE, _string(os.fsencode(path)))
        except SFTPError:
            pass

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:
            pass
