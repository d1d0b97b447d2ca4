"""The trainer's directories on a node, looked at before a launch: ``dirs SPEC`` -> one JSON line (node.lines).

SPEC is a JSON object ``{"workdir", "min_free", "dirs": [{"kind": "data" | "run", "path", "generate", and for data
"task", "format", "base" (the node's data_dir)}]}``. The answer is ``{"user", "psutil", "dirs": [{..., "resolved",
"problem"}]}``: each directory as asked, with its path resolved on the node (``~`` the node's home, a relative path
from the workdir) and its problem, None or ``{"why": "unwritable" | "unreadable" | "notdir" | "space", "at": path[,
"free": bytes]}``, or for data not prepared for the task ``{"why": "nodata" | "notprepared" | "form" | "task" |
"files", "at": path[, "found": what meta.json says]}``; a data directory also gets "vocab" (its tokenizer's, or None)
and "base_resolved". psutil: whether the node's Python has it (the launcher's stop and the trainer's memory figure
use it). Nothing is written. Client: cli/launch/preflight/storage.py, which also calls these functions on this
machine (its own log directory, a data directory here).
"""

import importlib.util
import json
import os

from node.lines import say


def resolve(path, workdir):
    p = os.path.expanduser(path)
    if not os.path.isabs(p):
        p = os.path.join(os.path.expanduser(workdir), p)
    return os.path.abspath(p)


def nearest(path):
    """path, or its nearest parent that exists."""
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def writable(target, min_free):
    """None when ``target`` (or, when it does not exist yet, its nearest existing parent) can be written with
    ``min_free`` bytes free, else the problem."""
    base = nearest(target)
    if not os.path.isdir(base):
        return {"why": "notdir", "at": base}
    if not os.access(base, os.W_OK | os.X_OK):
        return {"why": "unwritable", "at": base}
    try:
        st = os.statvfs(base)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    if free < min_free:
        return {"why": "space", "at": base, "free": free}
    return None


def prepared(path, task, form, found=None):
    """None when path holds data prepared for task (meta.json of this format, every file it names at its size),
    else what is wrong: {"why": "nodata" | "notprepared" | "form" | "task" | "files", "at", ...}. ``found``, a dict,
    gets the data's tokenizer vocabulary ("vocab") when the data is prepared."""
    meta_path = os.path.join(path, "meta.json")
    if not os.path.exists(meta_path):
        return {"why": "notprepared" if os.path.isdir(path) and os.listdir(path) else "nodata", "at": path}
    try:
        with open(meta_path) as fh:
            meta = json.load(fh)
    except ValueError:
        meta = {}
    if not isinstance(meta, dict) or meta.get("format") != form:
        return {"why": "form", "at": meta_path, "found": meta.get("format") if isinstance(meta, dict) else None}
    if meta.get("task") != task:
        return {"why": "task", "at": path, "found": meta.get("task")}
    for name, info in sorted((meta.get("files") or {}).items()):
        f = os.path.join(path, name)
        if not os.path.isfile(f) or os.path.getsize(f) != info.get("bytes"):
            return {"why": "files", "at": f}
    if found is not None:
        found["vocab"] = (meta.get("tokenizer") or {}).get("vocab_size")
    return None


def look(d, workdir, min_free):
    """The problem of directory ``d`` (a SPEC's entry; its "resolved" paths are set here), or None."""
    path = d["resolved"] = resolve(d["path"], workdir)
    if d["kind"] == "data":
        d["base_resolved"] = resolve(d.get("base") or d["path"], workdir)
        meta = os.path.join(path, "meta.json")
        if os.path.exists(meta) or not d.get("generate"):  # read only
            if os.path.isdir(path) and not os.access(path, os.R_OK | os.X_OK):
                return {"why": "unreadable", "at": path}
            if os.path.exists(meta) and not os.access(meta, os.R_OK):
                return {"why": "unreadable", "at": meta}
            found = {}
            problem = prepared(path, d.get("task"), d.get("format"), found)
            d["vocab"] = found.get("vocab")
            return problem
        return writable(os.path.dirname(path), min_free)  # made beside it, then renamed into place
    return writable(path, min_free)


def check(spec):
    try:
        import pwd
        user = pwd.getpwuid(os.geteuid()).pw_name
    except Exception:
        user = str(os.geteuid())
    dirs = [dict(d) for d in spec["dirs"]]
    for d in dirs:
        d["problem"] = look(d, spec["workdir"], spec["min_free"])
    return {"user": user, "psutil": importlib.util.find_spec("psutil") is not None, "dirs": dirs}


def main(argv: list) -> int:
    """argv: ``[SPEC]``, the JSON object above."""
    say(check(json.loads(argv[0])))
    return 0
