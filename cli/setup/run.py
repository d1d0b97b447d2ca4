"""`hrmctl setup`: make every node ready to train, in parallel, from this terminal.

Per node (NodeSetup): its own `python3` says what it has (node/setup.py `facts`, sent by node.ship); this checkout's
files go to its workdir with cli/sync (only what differs; the scan looks only at the project's own top-level names, so
.venv, data and runs are never walked); when the venv's stamp does not match this machine's lock and the node's
torch build, the wheels go over too (cached here once, only the ones the node lacks are sent) and the node builds
a new venv beside the old one and switches to it (node/setup.py `install`); then the stamp is written (`finish`) and
the doctor's commit and version facts are read with the venv's python and compared with this machine's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.errors import HrmctlError
from cli.nodes.inventory import Node
from cli.nodes.remote import Session, connect
from cli.setup import local
from cli.setup.distro import missing_python_line
from cli.setup.progress import NodeBars
from cli.setup.torch_build import TorchBuild, base_version, choose
from cli.sync.plan import scan_source
from cli.sync.run import NodeSync, _NodeSync
from node.lines import decode, last
from node.ship import program

BASE_PYTHON = "python3"  # what makes the venv on a node (its own interpreter; the inventory's python is the venv's)
MIN_PYTHON = (3, 10)
NODE_WHEELS = "~/.cache/hrmctl/wheels"
NODE_UV_CACHE = "~/.cache/hrmctl/uv"
INSTALL_TIMEOUT_S = 3600
COMPARED = ("torch", "transformers", "datasets", "tokenizers", "numpy", "paramiko")  # the probe's, less hrmctl


@dataclass
class NodeResult:
    node: str
    ok: bool = True
    error: str | None = None
    exit_code: int = 0
    python: str | None = None
    venv: str | None = None
    torch: dict | None = None
    commit: str | None = None
    code_files: int = 0
    code_sent: list[str] = field(default_factory=list)
    code_removed: list[str] = field(default_factory=list)
    venv_action: str = ""          # "unchanged", "build", "would build"
    venv_why: str = ""
    wheels_sent: int = 0
    wheels_bytes: int = 0
    install_command: list[str] = field(default_factory=list)
    checks: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Shared:
    """What every node's setup takes from this machine (made once)."""

    checkout: local.Checkout
    lock: local.Lock
    local_versions: dict[str, str | None]
    dry_run: bool
    reinstall: bool
    use_uv: bool
    wheel_lock: threading.Lock = field(default_factory=threading.Lock)
    sources: dict[str, Any] = field(default_factory=dict)

    def source(self, path: Path):
        with self.wheel_lock:
            if str(path) not in self.sources:
                self.sources[str(path)] = scan_source(path, checksum=False)
            return self.sources[str(path)]


def venv_of(node: Node) -> str:
    """The venv the inventory's python lives in: `X/bin/python` -> `X`."""
    parts = node.python.rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] != "bin" or not parts[-1].startswith("python"):
        raise HrmctlError(f"{node.name}: python = \"{node.python}\" is not a venv's interpreter; hrmctl setup builds "
                          f"the venv that python lives in: set python = \"{node.workdir.rstrip('/')}/.venv/bin/python\" "
                          "for it in the inventory (hrmctl init writes that)")
    return "/".join(parts[:-2])


def _nodeside(session: Session, op: str, job: dict, timeout: float | None = 60) -> dict:
    """node/setup.py's `op` run by the node's own python3: its JSON answer (HrmctlError when it failed)."""
    res = session.run([BASE_PYTHON, "-", op, json.dumps(job)], input=program("setup"), timeout=timeout)
    name = session.node.name
    if res.code == 127 or (res.code != 0 and not res.stdout.strip()):
        raise _NoPython(res.last_line())
    answer = last(res.stdout)
    if answer is None:
        raise HrmctlError(f"{name}: {BASE_PYTHON} answered garbage ({res.last_line()[:120]})", exit_code=1)
    if not answer.get("ok"):
        raise HrmctlError(f"{name}: {op} failed on the node: {answer.get('error')}", exit_code=1)
    return answer


class _NoPython(Exception):
    pass


class NodeSetup:
    def __init__(self, session: Session, node: Node, shared: Shared, bars: NodeBars, result: NodeResult):
        self.s, self.node, self.shared, self.bars, self.r = session, node, shared, bars, result
        self.name = node.name

    def run(self) -> None:
        venv = venv_of(self.node)
        self.r.venv = venv
        self.bars.phase(self.name, "node facts")
        facts = self._facts(venv)
        build = choose(self.shared.lock.torch_version, facts.get("nvidia_smi"))
        self.r.torch = build.as_dict()
        key = self._key(facts, build)
        marker = facts["venv"].get("marker") or {}
        need_venv = self.shared.reinstall or not facts["venv"]["exists"] or marker.get("key") != key
        self.r.venv_why = ("--reinstall" if self.shared.reinstall else "no venv yet" if not facts["venv"]["exists"]
                           else "packages or torch build differ from this machine's" if need_venv else
                           "same packages and torch build as this machine")
        self._send_code()
        if self.shared.dry_run:
            self.r.venv_action = "would build" if need_venv else "unchanged"
            return
        self.r.venv_action = "build" if need_venv else "unchanged"
        if need_venv:
            self._build_venv(facts, build, key, venv)
        self._finish(facts, build, key)
        self.bars.phase(self.name, "checking")
        self._verify()
        self.bars.done(self.name, "ready" if self.r.ok else "mismatch")

    # ------------------------------------------------------------ steps
    def _facts(self, venv: str) -> dict:
        try:
            facts = _nodeside(self.s, "facts", {"workdir": self.node.workdir, "venv": venv})
        except _NoPython as exc:
            raise HrmctlError(missing_python_line(self.s, self.name, f"no working {BASE_PYTHON} ({exc})")) from None
        version = tuple(int(x) for x in facts["python"].split(".")[:2])
        self.r.python = facts["python"]
        if version < MIN_PYTHON:
            raise HrmctlError(missing_python_line(self.s, self.name, f"{BASE_PYTHON} is {facts['python']}, "
                                                  f"the trainer needs >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}"))
        if not facts["venv_module"]:
            raise HrmctlError(missing_python_line(self.s, self.name, f"{BASE_PYTHON} has no venv module"))
        if facts["machine"] != os.uname().machine:
            raise HrmctlError(f"{self.name} is {facts['machine']}, this machine {os.uname().machine}: hrmctl setup "
                              "sends this machine's wheels; run it from a machine of the same kind", exit_code=1)
        return facts

    def _key(self, facts: dict, build: TorchBuild) -> str:
        py = ".".join(facts["python"].split(".")[:2])
        return hashlib.sha256(f"{self.shared.lock.sha256} {build.requirement} {py}".encode()).hexdigest()

    def _sync(self, src: Path, dest: str, only: list[str] | None) -> NodeSync:
        source: Future = Future()
        source.set_result(self.shared.source(src))
        result = NodeSync(node=self.name, dest=dest, dry_run=self.shared.dry_run)
        _NodeSync(self.s, source, result, checksum=False, delete=False, dry_run=self.shared.dry_run,
                  stall_timeout=60.0, progress=self.bars, cancel=threading.Event(), only=only).run()
        return result

    def _send_code(self) -> None:
        co = self.shared.checkout
        self.bars.phase(self.name, f"code {co.commit[:10]}")
        top = sorted({f.split("/", 1)[0] for f in co.files})
        sync = self._sync(co.staged, self.node.workdir, top)
        self.r.commit, self.r.code_files, self.r.code_sent = co.commit, sync.files, sync.to_send

    def _build_venv(self, facts: dict, build: TorchBuild, key: str, venv: str) -> None:
        self.bars.phase(self.name, "wheels (here)")
        with self.shared.wheel_lock:
            wheels = local.wheel_set(self.shared.lock, build, ".".join(facts["python"].split(".")[:2]),
                                     self.shared.use_uv)
        self.bars.phase(self.name, "wheels")
        sync = self._sync(wheels, NODE_WHEELS, None)
        self.r.wheels_sent = sync.sent_files
        self.r.wheels_bytes = sum(p.stat().st_size for p in wheels.glob("*.whl") if p.name in set(sync.to_send))
        uv = next((p.name for p in wheels.glob(f"uv-{local.UV_VERSION}-*.whl")), None)
        pip = next(p.name for p in wheels.glob(f"pip-{self.shared.lock.pip_version}-*.whl"))
        job = {"venv": venv, "key": key, "lock_sha256": self.shared.lock.sha256, "torch": build.requirement,
               "wheels": NODE_WHEELS, "lock": f"{NODE_WHEELS}/lock.txt", "uv_cache": NODE_UV_CACHE,
               "base_python": facts["executable"], "uv_wheel": uv, "pip_wheel": f"{NODE_WHEELS}/{pip}"}
        self.r.install_command = self._install_words(job)
        self.bars.phase(self.name, "installing")
        self._install(job)

    @staticmethod
    def _install_words(job: dict) -> list[str]:
        tool = ["uv", "pip", "install"] if job["uv_wheel"] else ["pip", "install", "--isolated"]
        return [*tool, "--no-index", "--find-links", job["wheels"], "--no-deps", "-r", job["lock"], "&&", *tool,
                "--no-index", "--find-links", job["wheels"], job["torch"]]

    def _install(self, job: dict) -> None:
        lines: list[str] = []

        def on_line(stream: str, line: str) -> None:
            step = (decode(line) or {}).get("step") if stream == "stdout" else None
            if step:
                self.bars.phase(self.name, f"installing: {step}")
            else:
                lines.append(line)

        job_ = self.s.start([BASE_PYTHON, "-c", program("setup"), "install", json.dumps(job)], on_line)
        exit_code = job_.wait(INSTALL_TIMEOUT_S)
        answer = last("\n".join(lines))
        if exit_code is None:
            job_.stop()
            raise HrmctlError(f"{self.name}: the install did not finish in {INSTALL_TIMEOUT_S}s; the previous venv "
                              "is still in place", exit_code=1)
        if not answer or not answer.get("ok"):
            why = (answer or {}).get("error") or (lines[-1] if lines else f"exit code {exit_code}")
            raise HrmctlError(f"{self.name}: installing the venv failed ({why[:300]}); the previous venv is still "
                              "in place", exit_code=1)

    def _finish(self, facts: dict, build: TorchBuild, key: str) -> None:
        co = self.shared.checkout
        stamp = {"commit": co.commit, "dirty": co.dirty, "lock_sha256": self.shared.lock.sha256,
                 "torch": build.requirement, "venv_key": key, "python": facts["python"]}
        old = facts.get("stamp") or {}
        if {k: old.get(k) for k in stamp} == stamp and sorted(old.get("files") or []) == co.files:
            return  # nothing to write: the no-op run stays a read-only one
        answer = _nodeside(self.s, "finish", {"workdir": self.node.workdir, "stamp": stamp, "files": co.files})
        self.r.code_removed = answer["removed"]

    def _verify(self) -> None:
        """The doctor's commit and version facts, read by the venv's python, against this machine's."""
        from netcheck.node_probe_client import ProbeError, run_probe

        node, session = self.node, self.s

        class VenvSession:  # the probe runs with the inventory's python (the venv), over the same connection
            def __init__(self):
                self.node = node

            def run_python(self, code, args=(), timeout=60):
                return session.run([node.python, "-", *args], input=code, timeout=timeout)

        try:
            probe = run_probe(VenvSession(), route_to=None, with_torch=False, timeout=60)
        except ProbeError as exc:
            self.r.checks["probe"] = {"status": "fail", "detail": str(exc), "fix": "hrmctl setup --reinstall"}
            self.r.ok, self.r.exit_code, self.r.error = False, 1, str(exc)
            return
        proj = probe.raw.get("project") or {}
        want = self.shared.checkout.commit
        self.r.checks["commit"] = _check(proj.get("commit") == want, f"{(proj.get('commit') or 'none')[:10]}",
                                         f"this machine has {want[:10]}")
        theirs = proj.get("versions") or {}
        for dist in COMPARED:
            mine, other = self.shared.local_versions.get(dist), theirs.get(dist)
            same = (base_version(mine or "") == base_version(other or "")) if dist == "torch" else mine == other
            self.r.checks[dist] = _check(same, str(other), f"this machine has {mine}")
        bad = [k for k, c in self.r.checks.items() if c["status"] != "ok"]
        if bad:
            self.r.ok, self.r.exit_code = False, 1
            self.r.error = f"{self.name}: after setup, {', '.join(bad)} still differ from this machine's"


def _check(ok: bool, detail: str, mismatch: str) -> dict:
    return {"status": "ok", "detail": detail} if ok else {"status": "fail", "detail": f"{detail} ({mismatch})",
                                                          "fix": "hrmctl setup"}


# ---------------------------------------------------------------- many nodes

def setup_nodes(nodes: list[Node], *, dry_run: bool, allow_dirty: bool, reinstall: bool = False, use_uv: bool = True,
                console=None, progress: bool = True, accept_new_host_keys: bool = False) -> list[NodeResult]:
    """Every node in parallel; one NodeResult each (a failure on one never hides the others). Bad local input
    (a dirty tree, a venv without pip) raises HrmctlError before any node is touched."""
    from node.probe import project_facts

    nodes = [n for n in nodes if not n.is_local] or []
    if not nodes:
        raise HrmctlError("no nodes to set up: name them with --nodes or in the inventory (this machine is "
                          "set up by scripts/install.sh)")
    for n in nodes:
        venv_of(n)
    shared = Shared(checkout=local.checkout(allow_dirty), lock=local.package_lock(),
                    local_versions=project_facts(None)["versions"], dry_run=dry_run, reinstall=reinstall,
                    use_uv=use_uv)
    results = [NodeResult(node=n.name) for n in nodes]

    def one(node: Node, result: NodeResult) -> None:
        t0 = time.monotonic()
        try:
            base = dataclasses.replace(node, python=BASE_PYTHON)  # the sync agent and node/setup.py run with python3
            with connect(base, accept_new_host_keys=accept_new_host_keys) as session:
                NodeSetup(session, node, shared, bars, result).run()
        except HrmctlError as exc:
            result.ok, result.error, result.exit_code = False, str(exc), exc.exit_code
        except Exception as exc:  # one node's surprise must not hide the others' results
            result.ok, result.error, result.exit_code = False, f"{node.name}: {type(exc).__name__}: {exc}", 1
        if not result.ok:
            bars.done(node.name, "failed")
        result.seconds = round(time.monotonic() - t0, 3)

    with NodeBars(console, [n.name for n in nodes], progress and not dry_run) as bars:
        threads = [threading.Thread(target=one, args=(n, r), daemon=True) for n, r in zip(nodes, results)]
        for th in threads:
            th.start()
        for th in threads:
            while th.is_alive():
                th.join(0.2)
    return results
