"""The peer checks' agent: a tiny line-based server on a node's stdin/stdout (standard library only).

Started once per node per command (`python -u -c ship.program("peer")`, over an SSH channel or a
local pipe; netcheck/peer_agent_client.py), it says {"ready": "peer"}, then answers one JSON line per
request line (node/lines.py):
  {"op":"t"}                           -> {"t": the node's wall clock, time.time()} (Cristian's method)
  {"op":"listen","ports":[29500,0]}    -> binds a TCP listener per port (0 = a random high port,
                                          as gloo and NCCL use), {"listening":[{asked,port,error}]}
  {"op":"connect","targets":[{host,port,token}],"timeout":s}
                                       -> connects to all targets in parallel, sends the token and
                                          expects it echoed by OUR listener: {"results":[{ok,ms,error}]}
  {"op":"close"}                       -> closes its listeners, {"closed":n}
It exits when its stdin closes, so a listener never outlives the command that made it.
"""

from __future__ import annotations

import json
import socket
import threading
import time

from node.lines import encode, requests, say, write

LISTENERS: list[socket.socket] = []


def serve(sock: socket.socket) -> None:
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return
        try:
            conn.settimeout(3)
            data = conn.recv(128)
            conn.sendall(b"hrmctl-ok " + data)
        except OSError:
            pass
        finally:
            conn.close()


def listen(ports: list[int]) -> dict:
    out = []
    for asked in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore does
        try:
            s.bind(("0.0.0.0", int(asked)))
            s.listen(128)
        except OSError as exc:
            s.close()
            out.append({"asked": asked, "port": None, "error": exc.strerror or str(exc), "errno": exc.errno})
            continue
        LISTENERS.append(s)
        threading.Thread(target=serve, args=(s,), daemon=True).start()
        out.append({"asked": asked, "port": s.getsockname()[1], "error": None})
    return {"listening": out}


def connect_one(target: dict, timeout: float) -> dict:
    token = str(target.get("token", "x")).encode()
    t0 = time.perf_counter()
    try:
        with socket.create_connection((target["host"], int(target["port"])), timeout=timeout) as c:
            ms = (time.perf_counter() - t0) * 1000
            c.settimeout(timeout)
            c.sendall(token)
            reply = b""
            while len(reply) < len(token) + 10:
                chunk = c.recv(256)
                if not chunk:
                    break
                reply += chunk
    except socket.timeout:
        return {"ok": False, "ms": None, "error": "timed out", "kind": "timeout"}
    except ConnectionRefusedError:
        return {"ok": False, "ms": None, "error": "connection refused", "kind": "refused"}
    except OSError as exc:
        return {"ok": False, "ms": None, "error": exc.strerror or str(exc), "kind": "error"}
    if reply != b"hrmctl-ok " + token:
        return {"ok": False, "ms": round(ms, 3), "error": "something else answered on that port", "kind": "foreign"}
    return {"ok": True, "ms": round(ms, 3), "error": None, "kind": None}


def connect(targets: list[dict], timeout: float) -> dict:
    results: list[dict | None] = [None] * len(targets)

    def run(i: int) -> None:
        results[i] = connect_one(targets[i], timeout)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(targets))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    return {"results": [r or {"ok": False, "ms": None, "error": "timed out", "kind": "timeout"} for r in results]}


def handle(line: str) -> str:
    try:
        req = json.loads(line)
        op = req.get("op")
        if op == "t":
            return encode({"t": time.time()})
        if op == "listen":
            return encode(listen(req.get("ports", [])))
        if op == "connect":
            return encode(connect(req.get("targets", []), float(req.get("timeout", 3))))
        if op == "close":
            n = len(LISTENERS)
            while LISTENERS:
                LISTENERS.pop().close()
            return encode({"closed": n})
        return encode({"error": f"unknown op {op!r}"})
    except Exception as exc:
        return encode({"error": f"{type(exc).__name__}: {exc}"})


def main(argv: list[str]) -> int:
    say({"ready": "peer"})
    for line in requests():
        write(handle(line))
    return 0
