"""The preflight's look at each node's directories: the trainer's data and run directories writable, with room.

Run in parallel with the node probe, over the same connection (one more command on it, no new
handshake), before anything starts anywhere. On every node, the data directory the trainer reads:
readable when it holds data (the trainer only reads it then); when the default sudoku data is to be
generated there, its parent writable (generation writes beside it and renames into place) with at
least MIN_FREE_MB free. On the master (global rank 0, the one rank that writes), the run directory
(out_dir: config, metrics, checkpoints) writable with MIN_FREE_MB free. A directory that does not
exist yet counts as writable when its nearest existing parent is. The same look also says whether
the node's Python has psutil (the launcher's stop and the trainer's memory figure use it).

A problem is one line naming node, directory and fix (exit 1: a failed check on a node; a missing
psutil, like a missing torch, is exit 2). Nothing is written on the nodes by the check itself.

The node side is node/dirs.py (standard library only), sent to the node's Python by node.ship.program("dirs");
this machine's own directories are looked at by the same functions, imported.
"""

from __future__ import annotations

import json
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from cli.errors import HrmctlError, RemoteError
from cli.nodes.inventory import Node
from cli.nodes.remote import Session
from node import dirs as node_dirs
from node.lines import last
from node.ship import program

MIN_FREE_MB = 300  # below this, a run directory (checkpoints) or generated data is refused
CHECK_TIMEOUT_S = 30
DEFAULT_DATA_ENV = "HRMCTL_DEFAULT_DATA_DIR"  # tells the trainer: data_dir is the node's default, not the user's

# auralm.data.datadir.FORMAT, sent to node/dirs.py (datadir imports torch: not here at every launch; a test keeps the
# two equal)
DATA_FORMAT = "auralm-data/1"

LABELS = {"data": "data directory", "run": "run directory (out_dir: logs and checkpoints)"}


@dataclass
class Dirs:
    """What the trainer reads and writes, before the nodes are asked (paths as the trainer gets them)."""

    task: str  # the trainer's task, as its parser reads the overrides
    data_given: str | None = None  # data_dir= (or an alias) given by the user: passed unchanged
    out_dir: str | None = None  # the run directory rank 0 writes (relative: to the master's workdir)
    data: dict[str, str] = field(default_factory=dict)  # node -> data_dir for the trainer (filled by check)
    train_path: str | None = None  # data.train_path=FILE: the trainer prepares its own data directory from it


def trainer_dirs(cfg, run_id: str) -> tuple[Dirs, list[str]]:
    """The trainer's directories under hrmctl, from its reading of the overrides (``cfg``, LaunchOptions.trainer: a
    guide's spelling, a config file's keys and the task a model implies, as the trainer reads them; None when it
    refuses them, whose check says why: the defaults here), and the overrides hrmctl adds (out_dir=runs/<run-id>
    when the user gave neither out_dir nor run_name; data_dir per node is added once the nodes have answered)."""
    from auralm.training import config  # no torch: a few milliseconds

    cfg = cfg or config.Config()
    given = set(cfg.given_keys)
    dirs = Dirs(task=cfg.task, data_given=cfg.data_dir if "data_dir" in given else None,
                out_dir=cfg.out_dir if "out_dir" in given else None, train_path=cfg.data.train_path or None)
    extra = []
    if dirs.out_dir is None:
        if cfg.run_name:
            dirs.out_dir = f"runs/{cfg.run_name}"
        else:
            dirs.out_dir = f"runs/{run_id}"  # checkpoints beside the logs; restarts resume from there
            extra.append(f"out_dir={dirs.out_dir}")
    return dirs, extra


def _makes_its_data(task: str) -> bool:
    """Whether the trainer makes ``task``'s data itself when its data directory is missing (sudoku's default data),
    as the task declares (auralm.tasks: ``default_rows``)."""
    from auralm import tasks  # no torch

    return task in tasks.names() and tasks.get(task).default_rows() is not None


def node_data_dir(node: Node, task: str) -> str:
    """The node's data directory for `task`: the inventory's data_dir (the root `hrmctl sync-data` fills, like
    ./data here) joined with the task, as the trainer's own default is data/<task>. Relative stays relative:
    the trainer runs in the node's workdir, which is what a relative data_dir is taken from."""
    base = node.data_dir.rstrip("/")
    return f"{base}/{task}" if base else f"/{task}"


def _spec(node: Node, dirs: Dirs | None, master: bool) -> dict:
    wanted = []
    if dirs is not None:
        if not dirs.train_path:  # data.train_path: the trainer makes its data directory from the file
            data = dirs.data_given or node_data_dir(node, dirs.task)
            wanted.append({"kind": "data", "path": data, "task": dirs.task, "format": DATA_FORMAT, "base": node.data_dir,
                           "local": node.is_local, "generate": dirs.data_given is None and _makes_its_data(dirs.task)})
        if master and dirs.out_dir:
            wanted.append({"kind": "run", "path": dirs.out_dir})
    return {"workdir": node.workdir, "min_free": MIN_FREE_MB << 20, "dirs": wanted}


def problem_line(node: str, d: dict, user: str, from_inventory: bool) -> str:
    """One line: the node, the directory, what is wrong, and the fix."""
    p, label, path = d["problem"], LABELS[d["kind"]], d["resolved"]
    at = p["at"]
    if p["why"] in DATA_PROBLEMS:
        return data_line(node, d)
    if d["kind"] == "data":
        elsewhere = f"set data_dir for {node} in the inventory" if from_inventory else "give another data_dir="
    else:
        elsewhere = f"give out_dir= a directory {user} can write on {node}"
    if p["why"] == "unwritable":
        return (f"{node}: cannot write the {label} {path}: {at} is not writable by {user}; fix: on {node} "
                f"`sudo chown -R {user} {shlex.quote(at)}`, or {elsewhere}")
    if p["why"] == "unreadable":
        return (f"{node}: cannot read the {label} {path}: {at} is not readable by {user}; fix: on {node} "
                f"`sudo chown -R {user} {shlex.quote(at)}` or `chmod -R u+rX {shlex.quote(at)}`, or {elsewhere}")
    if p["why"] == "notdir":
        return (f"{node}: cannot make the {label} {path}: {at} is a file, not a directory; fix: move {at} "
                f"away on {node}, or {elsewhere}")
    free_mb = p.get("free", 0) >> 20
    return (f"{node}: only {free_mb} MB free for the {label} {path} (at least {MIN_FREE_MB} MB needed); fix: "
            f"free space on {node} where {at} lives, or {elsewhere}")


DATA_PROBLEMS = ("nodata", "notprepared", "form", "task", "files")


def data_line(node: str, d: dict) -> str:
    """The node's data directory does not hold data prepared for the task: what is there, and the exact command
    that makes it: `hrmctl sync-data NODE` when this machine's ./data has it (sync-data sends ./data to the node's
    data_dir), else the `hrmctl prepare-data` line (with the --preset a sudoku directory named like one needs),
    then the sync for a remote node."""
    from auralm.data.datadir import prepare_command, prepare_hint  # imports torch: only on this path

    p, path, task = d["problem"], d["resolved"], d["task"]
    what = {"nodata": "no prepared data (no such directory, or empty)",
            "notprepared": "files, but no meta.json: not data made by `hrmctl prepare-data`",
            "form": f"a meta.json of another format ({p.get('found')!r}, not {DATA_FORMAT!r})",
            "task": f"{p.get('found')!r} data, not {task!r}",
            "files": f"data whose files do not match its meta.json ({p['at']} is missing or of another size)"}[p["why"]]
    sub = os.path.relpath(path, d["base_resolved"])
    under = not sub.startswith("..") and sub != "."
    local_copy = os.path.join("data", sub) if under else os.path.join("data", os.path.basename(path.rstrip("/")))
    if d.get("local"):
        fix = f"`{prepare_command(task, path if d['path'].startswith('~') else d['path'])}`"
    elif under and not prepared_here(local_copy, task):
        fix = f"`{prepare_command(task, local_copy)}` here, then `hrmctl sync-data {node}`"
    elif under:
        fix = f"`hrmctl sync-data {node}` (this machine's {local_copy} has it)"
    else:
        sync = f"`hrmctl sync-data {node} --src {shlex.quote(local_copy)} --dest {shlex.quote(d['path'])}`"
        fix = (f"{sync}" if prepared_here(local_copy, task) else
               f"`{prepare_command(task, local_copy)}` here, then {sync}")
    return f"{node}: {path} holds {what}; fix: {fix}{prepare_hint(task) if 'prepare-data' in fix else ''}"


def prepared_here(path: str, task: str) -> bool:
    return node_dirs.prepared(os.path.abspath(path), task, DATA_FORMAT) is None


def check_nodes(sessions: dict[str, Session], nodes: list[Node], dirs: Dirs | None) -> dict[str, dict]:
    """Every node's directories (and psutil) checked in parallel over its preflight session; the first
    problem, in the order of `nodes`, raises. Fills `dirs.data` with each node's data_dir for the trainer.
    `dirs` None: not the trainer (only psutil is checked)."""

    def one(node: Node, master: bool) -> dict:
        res = sessions[node.name].run_python(program("dirs"), [json.dumps(_spec(node, dirs, master))],
                                             timeout=CHECK_TIMEOUT_S)
        answer = last(res.stdout)
        if answer is None:
            raise RemoteError(f"{node.name}: cannot check its directories with {node.python} "
                              f"({res.last_line()}); run `hrmctl doctor` to see what the node lacks")
        return answer

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = [pool.submit(one, n, i == 0) for i, n in enumerate(nodes)]
    answers = {}
    for node, fut in zip(nodes, futures):
        ans = answers[node.name] = fut.result()
        if not ans.get("psutil"):
            raise HrmctlError(f"{node.name}: psutil is not installed for {node.python} (the launcher stops a job "
                              f"with it, the trainer reports memory with it); fix: on {node.name} "
                              f"`{node.python} -m pip install psutil`, or install the project there")
        for d in ans["dirs"]:
            if d.get("problem"):
                raise HrmctlError(problem_line(node.name, d, ans.get("user") or node.user,
                                               d["kind"] == "data" and dirs is not None and dirs.data_given is None),
                                  exit_code=1)
            if d["kind"] == "data" and dirs is not None:
                # `~/` is the node's home: the path the node resolved; otherwise as written (relative: to workdir)
                dirs.data[node.name] = d["resolved"] if d["path"].startswith("~") else d["path"]
    return answers


def check_local(path: str) -> None:
    """This machine's directory for hrmctl's own logs (runs/<run-id>, relative to here): writable, with room."""
    resolved = node_dirs.resolve(path, ".")
    p = node_dirs.writable(resolved, MIN_FREE_MB << 20)
    if p:
        why = {"unwritable": f"{p['at']} is not writable", "notdir": f"{p['at']} is a file, not a directory",
               "space": f"only {p.get('free', 0) >> 20} MB free there (at least {MIN_FREE_MB} MB needed)"}[p["why"]]
        raise HrmctlError(f"cannot write hrmctl's logs to {resolved}: {why}; fix: run hrmctl from a directory "
                          "you can write, with room", exit_code=1)
