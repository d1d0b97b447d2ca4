"""The node side of `hrmctl setup`, run by the node's own `python3` (`python3 - OP JSON`, the bootstrap of
ship.program("setup") on stdin; cli/setup/run.py): standard library only, since nothing of ours is installed there
yet. Each operation prints one JSON line at the end (node/lines.py); install says {"step": NAME} as it goes.

  facts    the node's Python (version, venv module), distribution, machine, `nvidia-smi` output, the setup stamp
           in the workdir and the venv the inventory's python points at (a link to a complete build, or not).
  install  a venv built at a new directory beside the venv's path (`<venv>-<key>-<nonce>`), the sent wheels
           installed into it from the sent directory only (uv or pip, `--no-index`), a marker written when
           complete, then the venv's path switched to it with one rename of a symlink. Until that rename the
           previous venv is untouched: a killed install leaves it working; the half-built directory is removed
           by the next install. Earlier builds are removed after the switch.
  finish   files of the previous setup that this commit no longer has are removed, and the stamp is written
           (to a temporary name, then renamed).
"""

import json
import os
import platform
import shutil
import subprocess
import sys
import time

from node.lines import say

STAMP = ".hrmctl-setup.json"
MARKER = "hrmctl-venv.json"


def expand(path):
    return os.path.abspath(os.path.expanduser(path))


def read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def os_release():
    out = {}
    try:
        with open("/etc/os-release") as fh:
            for line in fh:
                key, _, value = line.strip().partition("=")
                if key in ("ID", "ID_LIKE", "PRETTY_NAME", "VERSION_ID"):
                    out[key] = value.strip('"')
    except OSError:
        pass
    return out


def nvidia_smi():
    smi = shutil.which("nvidia-smi") or ("/usr/lib/wsl/lib/nvidia-smi"
                                         if os.path.exists("/usr/lib/wsl/lib/nvidia-smi") else None)
    if not smi:
        return None
    try:
        res = subprocess.run([smi], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.decode("utf-8", "replace") if res.returncode == 0 else None


def has_module(name):
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def venv_state(venv):
    path = expand(venv)
    target = os.path.realpath(path)
    marker = read_json(os.path.join(target, MARKER))
    return {"path": path, "exists": os.path.exists(os.path.join(path, "bin", "python")),
            "link": os.path.islink(path), "target": target, "marker": marker}


def facts(job):
    workdir = expand(job["workdir"])
    usage = shutil.disk_usage(os.path.dirname(workdir) if not os.path.isdir(workdir) else workdir) \
        if os.path.isdir(os.path.dirname(workdir)) else None
    return {"python": platform.python_version(), "executable": sys.executable,
            "venv_module": has_module("venv"), "os": os_release(), "machine": platform.machine(),
            "nvidia_smi": nvidia_smi(), "home": os.path.expanduser("~"), "workdir": workdir,
            "stamp": read_json(os.path.join(workdir, STAMP)), "venv": venv_state(job["venv"]),
            "free_bytes": usage.free if usage else None}


def step(text):
    say({"step": text})


def remove_tree(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def leftovers(link, keep):
    """Other builds of this venv: `<venv>-<key>-<nonce>` directories, and the `<venv>.previous-*` a real
    directory was moved to when the link first replaced it."""
    parent, base = os.path.split(link)
    found = []
    for name in os.listdir(parent):
        full = os.path.join(parent, name)
        if full in keep:
            continue
        if name.startswith(base + "-") and os.path.isfile(os.path.join(full, "pyvenv.cfg")):
            found.append(full)
        elif name.startswith(base + ".previous-") or name.startswith(base + ".link-"):
            found.append(full)
    return found


def run(argv, env):
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = proc.stdout.decode("utf-8", "replace").strip().splitlines()[-12:]
        raise RuntimeError("`%s` failed (exit %d): %s" % (" ".join(argv[:4]) + " ...", proc.returncode,
                                                           " | ".join(tail)))


def uv_binary(wheel, cache):
    """uv's binary out of its wheel (once per version), beside uv's cache."""
    import zipfile
    out = os.path.join(os.path.dirname(cache), "bin", os.path.basename(wheel).split("-py")[0])
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = "%s.%d" % (out, os.getpid())
        with zipfile.ZipFile(wheel) as z:
            member = [n for n in z.namelist() if n.endswith("/scripts/uv")][0]
            with z.open(member) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    return out


def build(job, target):
    wheels, lock = expand(job["wheels"]), expand(job["lock"])
    env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, UV_NO_CONFIG="1", UV_PYTHON_DOWNLOADS="never",
               UV_CACHE_DIR=expand(job["uv_cache"]))
    env.pop("VIRTUAL_ENV", None)
    python = os.path.join(target, "bin", "python")
    if job.get("uv_wheel"):
        uv = uv_binary(os.path.join(wheels, job["uv_wheel"]), expand(job["uv_cache"]))
        step("venv")
        run([uv, "venv", "--quiet", "--python", job["base_python"], target], env)
        step("packages")
        run([uv, "pip", "install", "--quiet", "--python", python, "--no-index", "--find-links", wheels, "--no-deps",
             "-r", lock], env)
        step("torch")
        run([uv, "pip", "install", "--quiet", "--python", python, "--no-index", "--find-links", wheels,
             job["torch"]], env)
        return
    pip_wheel = expand(job["pip_wheel"])
    step("venv")
    run([job["base_python"], "-m", "venv", "--without-pip", target], env)
    pip = [python, os.path.join(pip_wheel, "pip"), "install", "--isolated", "--quiet", "--disable-pip-version-check",
           "--no-index", "--find-links", wheels]
    step("packages")
    run(pip + ["--no-deps", "-r", lock], env)
    step("torch")
    run(pip + [job["torch"]], env)


def switch(link, target):
    """Point `link` at `target` in one rename; a real directory there is moved aside first."""
    if os.path.exists(link) and not os.path.islink(link):
        os.rename(link, "%s.previous-%d" % (link, int(time.time())))
    tmp = "%s.link-%d" % (link, os.getpid())
    remove_tree(tmp)
    os.symlink(os.path.basename(target), tmp)
    os.replace(tmp, link)


def install(job):
    link = expand(job["venv"])
    parent = os.path.dirname(link)
    if not os.path.isdir(parent):
        os.makedirs(parent)
    current = os.path.realpath(link) if os.path.exists(link) else None
    for stale in leftovers(link, {current} if current else set()):  # half-built ones of a killed install too
        remove_tree(stale)
    target = "%s-%s-%d" % (link, job["key"][:12], os.getpid())
    build(job, target)
    marker = {"key": job["key"], "lock_sha256": job["lock_sha256"], "torch": job["torch"], "complete": True}
    with open(os.path.join(target, MARKER), "w") as fh:
        json.dump(marker, fh)
        fh.flush()
        os.fsync(fh.fileno())
    step("switch")
    switch(link, target)
    for old in leftovers(link, {target}):
        remove_tree(old)
    return {"venv": link, "target": target}


def finish(job):
    workdir = expand(job["workdir"])
    path = os.path.join(workdir, STAMP)
    old = read_json(path) or {}
    keep = set(job["files"])
    removed = []
    for rel in old.get("files") or []:
        if rel in keep or rel.startswith("/") or ".." in rel.split("/"):
            continue
        full = os.path.join(workdir, rel)
        if os.path.isfile(full) and not os.path.islink(full):
            os.unlink(full)
            removed.append(rel)
    stamp = dict(job["stamp"], files=sorted(keep))
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(stamp, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return {"removed": removed}


def main(argv):
    op, job = argv[0], json.loads(argv[1])
    try:
        answer = {"facts": facts, "install": install, "finish": finish}[op](job)
        answer["ok"] = True
    except Exception as exc:  # one line for the other side, never a traceback
        answer = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    say(answer)
    return 0
