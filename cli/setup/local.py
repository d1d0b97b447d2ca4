"""This machine's side of `hrmctl setup`: the checkout to send, the package lock, and the wheels for the nodes.

checkout()       this project's git checkout (the one hrmctl runs from): commit, dirty or not, and a staging copy
                 of exactly what is sent (`git archive` of HEAD; with --allow-dirty the working tree's files)
package_lock()   `pip freeze` of the Python running hrmctl, without torch and without editable installs (this
                 project): the lines every node's venv gets, and their SHA-256
wheel_set()      the wheels of a lock and a torch build in one directory (hard links into the wheel cache):
                 downloaded once here (`pip download`, this machine's pip configuration) and reused
Everything is cached under $HRMCTL_CACHE (else $XDG_CACHE_HOME/hrmctl, else ~/.cache/hrmctl).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from cli.cache import cache_dir
from cli.errors import HrmctlError
from cli.setup.torch_build import TorchBuild

ROOT = Path(__file__).resolve().parents[2]
UV_VERSION = "0.13.9"  # the uv sent to the nodes (its binary is inside the wheel); pip is the fallback
PIP_DOWNLOAD_TIMEOUT = 1800
INDEX_TIMEOUT_S = 10  # a PyTorch index this machine cannot reach fails fast


class SetupError(HrmctlError):
    """A setup step on this machine failed (exit code 1 unless said otherwise)."""

    exit_code = 1


def _git(*args: str) -> str:
    try:
        res = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise HrmctlError(f"cannot run git in {ROOT} ({exc}); hrmctl setup sends this git checkout, install git") from None
    if res.returncode != 0:
        raise HrmctlError(f"{ROOT} is not a git checkout (git {args[0]}: {res.stderr.strip()[:120]}); "
                          "hrmctl setup sends a clone's exact commit: run it from a git clone of the project")
    return res.stdout


@dataclass
class Checkout:
    root: Path
    commit: str
    dirty: bool
    staged: Path          # the files as they are sent
    files: list[str] = field(default_factory=list)


def checkout(allow_dirty: bool) -> Checkout:
    commit = _git("rev-parse", "HEAD").strip()
    changed = _git("status", "--porcelain", "--untracked-files=no").rstrip()
    if changed and not allow_dirty:
        first = changed.splitlines()[0][3:]
        raise HrmctlError(f"{ROOT} has uncommitted changes ({len(changed.splitlines())} files, e.g. {first}); "
                          "commit them so every node gets this exact commit, or pass --allow-dirty to send the "
                          "working tree as it is")
    if not changed:
        staged = cache_dir() / "src" / commit
        if not (staged / ".complete").exists():
            _archive_head(staged)
    else:
        staged = _stage_working_tree(commit)
    files = sorted(str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file() and p.name != ".complete")
    return Checkout(ROOT, commit, bool(changed), staged, files)


def _archive_head(dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = dest.with_suffix(".tar")
    with open(archive, "wb") as fh:
        res = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], stdout=fh,
                             stderr=subprocess.PIPE, timeout=300)
    if res.returncode != 0:
        raise HrmctlError(f"git archive HEAD failed in {ROOT}: {res.stderr.decode(errors='replace').strip()[:160]}")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar") if hasattr(tarfile, "tar_filter") else tar.extractall(dest)
    archive.unlink()
    (dest / ".complete").write_text("")


def _stage_working_tree(commit: str) -> Path:
    """The working tree's files (tracked, and untracked ones git does not ignore) copied as they are; a file
    already staged with the same size and mtime is kept (the no-op run copies nothing)."""
    names = {n for n in _git("ls-files", "-co", "--exclude-standard", "-z").split("\0") if n}
    dest = cache_dir() / "src" / f"{commit}-dirty"
    for old in [p for p in dest.rglob("*") if p.is_file()] if dest.is_dir() else []:
        if str(old.relative_to(dest)) not in names:
            old.unlink()
    for name in sorted(names):
        src, dst = ROOT / name, dest / name
        if not src.is_file() or src.is_symlink():
            continue
        st = src.stat()
        if dst.is_file() and dst.stat().st_size == st.st_size and dst.stat().st_mtime_ns == st.st_mtime_ns:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    return dest


# ---------------------------------------------------------------- packages

@dataclass
class Lock:
    lines: list[str]        # `pip freeze --all` (pip and setuptools too), torch and this project left out
    torch_version: str      # this machine's, with its local tag (2.13.0+cpu)
    pip_version: str
    python: str             # major.minor

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(f"python {self.python}\n{self.text}".encode()).hexdigest()


def package_lock() -> Lock:
    """What `pip freeze --all --exclude-editable` of this venv says, read from the installed metadata directly
    (pip itself takes seconds to start on a busy machine). A package installed from a path or URL is refused:
    a node cannot get it by version."""
    import json
    from importlib import metadata

    found: dict[str, str] = {}
    torch = None
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        key = _normalize(name or "")
        if not name or key in found or (key == "torch" and torch):
            continue  # the first on sys.path wins, as for imports
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        if key == "hrmctl" or (direct.get("dir_info") or {}).get("editable"):
            continue  # this project (or another editable checkout): the node runs it from its workdir
        if key == "torch":
            torch = dist.version
            continue
        if direct and not direct.get("url", "").startswith("file:///") or "dir_info" in direct or "vcs_info" in direct:
            raise SetupError(f"this venv has {name} installed from {direct.get('url')}: a node cannot get it by "
                             "version; install it from an index (pip install NAME==VERSION) and run setup again")
        found[key] = f"{name}=={dist.version}"
    if torch is None:
        raise SetupError(f"torch is not installed in {sys.prefix}; install torch here first (bash scripts/install.sh)")
    if "pip" not in found:
        raise SetupError(f"{sys.prefix} has no pip; hrmctl setup gives the nodes this venv's pip too: "
                         f"`{sys.executable} -m ensurepip`")
    lines = [found[k] for k in sorted(found)]
    return Lock(lines, torch, found["pip"].split("==")[1], f"{sys.version_info[0]}.{sys.version_info[1]}")


# ---------------------------------------------------------------- wheels

def _pip_download(args: list[str], dest: Path, what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "-d", str(dest), *args]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_DOWNLOAD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SetupError(f"downloading {what} took over {PIP_DOWNLOAD_TIMEOUT}s; check this machine's network") from None
    if res.returncode != 0:
        err = [l for l in res.stderr.strip().splitlines() if not l.startswith("WARNING: Location")]
        raise SetupError(f"cannot download {what} here ({(err or ['pip download failed'])[-1][:200]}); "
                         "the nodes install only wheels this machine sends")


def _wheel_name(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return name.lower().replace("_", "-").replace(".", "-"), version


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _missing(pool: Path, reqs: list[str]) -> list[str]:
    have = {_wheel_name(p) for p in pool.glob("*.whl")}
    out = []
    for req in reqs:
        name, version = req.split("==", 1)
        if (_normalize(name), version) not in have:
            out.append(req)
    return out


def torch_wheel(pool: Path, build: TorchBuild, pyver: list[str]) -> None:
    """The torch wheel of `build` in the pool: this machine's pip configuration first (a local file or mirror),
    then the build's own PyTorch index with a short timeout (its CUDA libraries come with it)."""
    if not _missing(pool, [build.requirement]):
        return
    try:
        _pip_download([*pyver, build.requirement], pool, build.requirement)
        return
    except SetupError:
        pass
    args = [*pyver, "--index-url", build.index, "--timeout", str(INDEX_TIMEOUT_S), "--retries", "0"]
    if build.cuda:  # its nvidia-* libraries: with dependencies, from the same index
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
               "-d", str(pool), *args, build.requirement]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_DOWNLOAD_TIMEOUT)
        if res.returncode == 0:
            return
        raise SetupError(f"cannot download {build.requirement} from {build.index} here; connect this machine to "
                         "the internet once (the wheels are cached), or put the wheel in pip's find-links")
    _pip_download([*args, build.requirement], pool, f"{build.requirement} from {build.index}")


def wheel_set(lock: Lock, build: TorchBuild, python: str, use_uv: bool) -> Path:
    """A directory holding exactly the wheels a node needs (hard links into the pool), made once per set."""
    tag = f"py{python}-{os.uname().machine}"
    pool = cache_dir() / "wheels" / tag
    pool.mkdir(parents=True, exist_ok=True)
    extra = [f"uv=={UV_VERSION}"] if use_uv else []  # pip is in the lock (freeze --all: torch needs setuptools)
    want = lock.lines + extra
    missing = _missing(pool, want)
    pyver = [] if python == lock.python else ["--python-version", python]  # a node's other Python: its wheels
    if missing:
        _pip_download([*pyver, *missing], pool, f"{len(missing)} packages")
    torch_wheel(pool, build, pyver)
    key = hashlib.sha256((lock.sha256 + build.requirement + "".join(extra) + python).encode()).hexdigest()[:16]
    out = cache_dir() / "wheelsets" / key
    if not (out / ".complete").exists():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        names = {(_normalize(r.split("==")[0]), r.split("==")[1]) for r in want + [build.requirement]}
        for whl in pool.glob("*.whl"):
            if _wheel_name(whl) in names or (build.cuda and whl.name.startswith(("nvidia_", "triton-"))):
                os.link(whl, out / whl.name)
        (out / "lock.txt").write_text(lock.text)
        (out / ".complete").write_text("")
    return out
