"""The runs under a runs directory, read from what the launcher and the trainer leave in each run directory.

A run directory (``runs/<run-id>/``) holds, from `hrmctl train` (cli/launch): ``<node>.log`` per node and
``status.json`` (written at the start: running, with the launcher's pid and host; rewritten at the end: finished,
failed or stopped, the exit code and the reason); from the trainer's rank 0 (auralm): ``config.json``,
``metrics.jsonl``, ``events.jsonl``, ``checkpoint-N/`` and, at the end, ``curves.png``.

Status, in this order:
  - status.json says finished, failed or stopped: that, with its exit code and reason;
  - status.json says running: running while that launcher process lives (checked by pid and its start time, on
    this host; another host's launcher cannot be checked, and is taken at its word). A launcher that is gone without
    writing the end (killed, or the machine restarted): finished when the metrics reach training.max_steps, running
    when the run directory was written in the last RECENT_S seconds (its processes may outlive the launcher),
    else stopped;
  - no status.json (the trainer run without hrmctl, `python -m auralm.training.train`): finished when the metrics reach
    training.max_steps, running when written in the last RECENT_S seconds, else unknown.
The reason says which rule gave the status; `source` is "status.json" or "inferred".
"""

from __future__ import annotations

import difflib
import json
import math
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from auralm.parallel import strategy
from auralm.training.curves import CURVES, number, read_metrics

# The module names that runs recorded before auralm was split into rooms (#35) carry in their status.json.
RECORDED_BEFORE_ROOMS = {"auralm.train": "auralm.training.train", "auralm.ddp_check": "auralm.planning.ddp_check"}

from cli.errors import HrmctlError
from cli.runs.states import ACTIVE, ENDED, RunState

RUNS_DIR = "runs"
STATUS_FILE = "status.json"  # written by cli/launch/supervise/status.py (started, ended)
RECENT_S = 120.0
RUN_ID_TIME = re.compile(r"^(\d{8}-\d{6})")  # hrmctl's and the trainer's own run names begin with the start time
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_FILES = ("config.json", "metrics.jsonl", "events.jsonl")
SLURM_FILE = "slurm.json"  # written by `hrmctl train --slurm` (cli/slurm/submit.py): the job id


@dataclass
class Run:
    id: str
    path: Path  # the run directory
    trainer_dir: Path  # where config.json and metrics.jsonl are: the run directory, unless out_dir= was elsewhere
    status: str = RunState.UNKNOWN
    reason: str = ""
    source: str = "inferred"  # "status.json" when the launcher recorded the state
    exit_code: int | None = None
    no_restart: str | None = None  # why hrmctl did not restart it (a stop a restart cannot fix), from status.json
    start: float | None = None
    end: float | None = None  # None while running
    nodes: list[str] = field(default_factory=list)
    world: int | None = None
    module: str | None = None
    task: str | None = None
    model: str | None = None
    sync: str | None = None
    steps: int | None = None
    max_steps: int | None = None
    best_val_loss: float | None = None
    best_exact_accuracy: float | None = None
    last_loss: float | None = None
    logs: list[Path] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    curves: Path | None = None
    last_write: float | None = None
    slurm_job: str | None = None  # submitted with --slurm: the job's id, and its state as Slurm tells it
    slurm_state: str | None = None
    members: list[dict] = field(default_factory=list)  # nodes that left and joined (training.elastic), with times

    @property
    def duration(self) -> float | None:
        if self.start is None:
            return None
        running = self.status == RunState.RUNNING
        end = self.end if self.end is not None else (time.time() if running else self.last_write)
        return max(0.0, end - self.start) if end is not None else None

    def to_dict(self) -> dict:
        return {
            "id": self.id, "path": str(self.path), "status": self.status, "reason": self.reason,
            "source": self.source, "exit_code": self.exit_code, "no_restart": self.no_restart,
            "start": _iso(self.start), "end": _iso(self.end),
            "duration_s": None if self.duration is None else round(self.duration, 1),
            "nodes": self.nodes, "world": self.world, "task": self.task, "model": self.model, "sync": self.sync,
            "steps": self.steps, "max_steps": self.max_steps, "best_val_loss": self.best_val_loss,
            "best_exact_accuracy": self.best_exact_accuracy, "last_loss": self.last_loss,
            "checkpoints": self.checkpoints, "logs": [p.name for p in self.logs],
            "curves": str(self.curves) if self.curves else None,
            "trainer_dir": str(self.trainer_dir) if self.trainer_dir != self.path else None,
            "slurm_job": self.slurm_job, "slurm_state": self.slurm_state,
            "members": [{**e, "t": _iso(number(e.get("t")))} for e in self.members],
        }


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ts))


def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def read_submitted(run_path: Path) -> dict:
    """runs/<run-id>/slurm.json ({} unless the run was submitted with `hrmctl train --slurm`)."""
    return _json(Path(run_path) / SLURM_FILE)


def read_status(run_path: Path) -> dict:
    """The run's status.json as the launcher last wrote it ({} when there is none)."""
    return _json(Path(run_path) / STATUS_FILE)


def last_line(path: Path) -> str:
    """The last non-empty line of a text file ("" when it is missing or empty)."""
    try:
        lines = [line for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def looks_like_run(path: Path) -> bool:
    """A directory with something a launch or a training leaves there."""
    if not path.is_dir() or path.name.startswith("."):
        return False
    try:
        names = [p.name for p in path.iterdir()]
    except OSError:
        return False
    return any(n in TRAINER_FILES or n in (STATUS_FILE, SLURM_FILE) or n.endswith(".log") or CHECKPOINT_RE.match(n)
               for n in names)


def run_dirs(runs_dir: str | Path) -> list[Path]:
    root = Path(runs_dir)
    try:
        return sorted(p for p in root.iterdir() if looks_like_run(p))
    except (FileNotFoundError, NotADirectoryError):
        return []


def launcher_alive(doc: dict) -> bool | None:
    """Is the launcher that wrote this running status still running? None: it runs on another host."""
    if doc.get("host") != socket.gethostname():
        return None
    pid = doc.get("pid")
    if not isinstance(pid, int):
        return False
    import psutil

    try:
        proc = psutil.Process(pid)
        started = doc.get("pid_started")
        # the same pid and start time: that process, not a later one given its number again
        return not isinstance(started, (int, float)) or abs(proc.create_time() - started) < 1.0
    except psutil.Error:
        return False


def _last_write(*dirs: Path) -> float | None:
    times = []
    for d in dict.fromkeys(dirs):
        try:
            for p in d.iterdir():
                if not p.name.startswith("."):
                    times.append(p.stat().st_mtime)
        except OSError:
            pass
    return max(times) if times else None


def _first_write(*dirs: Path) -> float | None:
    times = []
    for d in dict.fromkeys(dirs):
        try:
            times += [p.stat().st_mtime for p in d.iterdir() if not p.name.startswith(".")]
        except OSError:
            pass
    return min(times) if times else None


def _ago(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _status(run: Run, doc: dict, now: float) -> None:
    reached = run.steps is not None and run.max_steps is not None and run.steps >= run.max_steps
    recent = run.last_write is not None and now - run.last_write < RECENT_S
    state = doc.get("state")
    where = f"step {run.steps if run.steps is not None else '?'} of {run.max_steps if run.max_steps else '?'}"
    if state in ENDED:
        run.status, run.source = state, "status.json"
        run.exit_code = doc.get("exit_code") if isinstance(doc.get("exit_code"), int) else None
        run.reason = str(doc.get("reason") or "")
        run.no_restart = doc.get("no_restart") if isinstance(doc.get("no_restart"), str) else None
        return
    if state == RunState.RUNNING:
        who = f"hrmctl (pid {doc.get('pid')} on {doc.get('host')})"
        alive = launcher_alive(doc)
        if alive is None:
            run.status, run.source, run.reason = RunState.RUNNING, "status.json", f"{who}: not checked from this host"
        elif alive:
            run.status, run.source, run.reason = RunState.RUNNING, "status.json", f"{who} is running it"
        elif reached:
            run.status, run.reason = RunState.FINISHED, (f"the metrics reach the last step; {who} is gone "
                                                         f"without recording the end")
        elif recent:
            run.status, run.reason = RunState.RUNNING, (f"{who} is gone without recording the end, but the run "
                                                        f"directory was written {_ago(now - run.last_write)} ago")
        else:
            run.status, run.reason = RunState.STOPPED, (f"{who} is gone without recording the end (killed, or the "
                                                        f"machine restarted); the run stopped at {where}")
        return
    if reached:
        run.status, run.reason = RunState.FINISHED, ("the metrics reach training.max_steps (no status.json: not "
                                                     "started by hrmctl)")
    elif recent:
        run.status, run.reason = RunState.RUNNING, (f"no status.json (not started by hrmctl); at {where}, written "
                                                    f"{_ago(now - run.last_write)} ago")
    else:
        run.status, run.reason = RunState.UNKNOWN, (f"no status.json (not started by hrmctl) and the metrics stop at "
                                                    f"{where}; nothing records why")


def slurm_job_of(status: dict, submitted: dict) -> str | None:
    """The Slurm job of a run: submitted with --slurm (slurm.json), or launched inside an allocation (status.json)."""
    job = submitted.get("job_id") or status.get("slurm_job")
    return str(job) if job else None


def _slurm_status(run: Run, doc: dict, job_id: str) -> None:
    """A Slurm run: Slurm's state of its job decides while the job is queued (or requeued), and while it runs or
    after it ended when the run's own hrmctl has not recorded an end (not started yet, cancelled, killed); else
    status.json's."""
    from cli.slurm.jobs import ENDED, QUEUED, job_state

    run.slurm_job = job_id
    found = job_state(job_id)
    if found is None:
        return
    state = run.slurm_state = found["state"]
    said = f"Slurm job {job_id} {state}" + (f" ({found['reason']})" if found["reason"] else "")
    if state in QUEUED:  # not started yet, or requeued (time limit, preemption): it will run
        run.status, run.source, run.reason, run.end = RunState.QUEUED, found["source"], said, None
    elif doc.get("state") in ENDED:
        return  # the run's own record (one allocation may hold several runs, one after the other)
    elif state in ("RUNNING", "COMPLETING"):
        where = f" on {found['nodes']}" if found["nodes"] else ""
        run.status, run.source, run.reason, run.end = RunState.RUNNING, found["source"], said + where, None
    elif state in ENDED:
        run.status = RunState.FINISHED if state == "COMPLETED" else RunState.STOPPED if state == "CANCELLED" else \
            RunState.FAILED
        run.source, run.reason = found["source"], said


def load_run(path: str | Path, now: float | None = None) -> Run:
    """What a run directory says about its run."""
    path = Path(path)
    now = time.time() if now is None else now
    doc = _json(path / STATUS_FILE)
    trainer_dir = path
    elsewhere = doc.get("trainer_dir")
    if isinstance(elsewhere, str) and not (path / "config.json").exists() and Path(elsewhere).is_dir():
        trainer_dir = Path(elsewhere)
    run = Run(id=path.name, path=path, trainer_dir=trainer_dir)
    cfg = _json(trainer_dir / "config.json")
    records = read_metrics(trainer_dir)

    run.module = doc.get("module") if isinstance(doc.get("module"), str) else None
    run.module = RECORDED_BEFORE_ROOMS.get(run.module, run.module)
    if run.module and run.module != "auralm.training.train":
        run.task = "test-ddp" if run.module == "auralm.planning.ddp_check" else run.module
    else:
        run.task = cfg.get("task") if isinstance(cfg.get("task"), str) else None
    model = cfg.get("model")
    run.model = model.get("name") if isinstance(model, dict) else None
    training = cfg.get("training") if isinstance(cfg.get("training"), dict) else {}
    run.max_steps = training.get("max_steps") if isinstance(training.get("max_steps"), int) else None
    if cfg:
        run.sync = training.get("sync") if isinstance(training.get("sync"), str) else strategy.DEFAULT

    try:
        run.checkpoints = sorted(int(m.group(1)) for p in trainer_dir.iterdir()
                                 if p.is_dir() and (m := CHECKPOINT_RE.match(p.name)))
    except OSError:
        run.checkpoints = []
    steps = [records[-1]["step"]] if records else []
    run.steps = max(steps + run.checkpoints[-1:]) if steps or run.checkpoints else None
    vals = [v for r in records if (v := number(r.get("val_loss"))) is not None]
    run.best_val_loss = min(vals) if vals else None
    exact = [v for r in records if (v := number(r.get("exact_accuracy"))) is not None]
    run.best_exact_accuracy = max(exact) if exact else None
    losses = [v for r in records if (v := number(r.get("loss"))) is not None]
    run.last_loss = losses[-1] if losses else None

    run.logs = sorted(path.glob("*.log"))
    nodes = doc.get("nodes")
    run.nodes = [str(n) for n in nodes] if isinstance(nodes, list) else [p.stem for p in run.logs]
    run.world = doc.get("world") if isinstance(doc.get("world"), int) else None
    members = doc.get("members")
    run.members = [e for e in members if isinstance(e, dict)] if isinstance(members, list) else []
    curves = trainer_dir / CURVES
    run.curves = curves if curves.exists() else None
    run.last_write = _last_write(path, trainer_dir)

    started = number(doc.get("started"))
    if started is None:
        m = RUN_ID_TIME.match(path.name)
        if m:
            try:
                started = time.mktime(time.strptime(m.group(1), "%Y%m%d-%H%M%S"))
            except ValueError:
                started = None
    job = _json(path / SLURM_FILE)
    if started is None:
        started = number(job.get("submitted"))
    run.start = started if started is not None else _first_write(path, trainer_dir)
    _status(run, doc, now)
    job_id = slurm_job_of(doc, job)
    if job_id:
        _slurm_status(run, doc, job_id)
    if run.status not in ACTIVE:
        run.end = number(doc.get("ended")) if doc.get("state") in ENDED else None
        if run.end is None:
            run.end = run.last_write
    return run


def list_runs(runs_dir: str | Path) -> list[Run]:
    """Every run under RUNS_DIR, the newest first."""
    runs = [load_run(p) for p in run_dirs(runs_dir)]
    runs.sort(key=lambda r: (r.start if r.start is not None else -math.inf, r.id), reverse=True)
    return runs


def nearest(ref: str, ids: list[str], n: int = 3) -> list[str]:
    """The ids most like REF: those containing it first, then by similarity."""
    inside = [i for i in ids if ref and ref in i]
    close = difflib.get_close_matches(ref, ids, n=n, cutoff=0.0)
    return list(dict.fromkeys(inside + close))[:n]


def resolve(ref: str, runs_dir: str | Path = RUNS_DIR) -> Path:
    """RUN as the user gave it: an id under RUNS_DIR, a unique prefix of one, or a path to a run directory (or to
    one of its checkpoints). Anything else is one line naming the nearest ids (exit code 2)."""
    root = Path(runs_dir)
    dirs = run_dirs(root)
    ids = [p.name for p in dirs]
    if ref in ids:
        return root / ref
    path = Path(ref).expanduser()
    if path.is_dir():
        if CHECKPOINT_RE.match(path.name) and looks_like_run(path.parent):
            return path.parent
        if looks_like_run(path):
            return path
    stem = ref.rstrip("/").rsplit("/", 1)[-1] if ref.startswith(str(root).rstrip("/") + "/") else ref
    matches = [i for i in ids if i.startswith(stem)] if stem else []
    if len(matches) == 1:
        return root / matches[0]
    if len(matches) > 1:
        shown = ", ".join(matches[:5]) + (f" and {len(matches) - 5} more" if len(matches) > 5 else "")
        raise HrmctlError(f"run '{ref}' is ambiguous: {len(matches)} runs in {root}/ begin with it ({shown}); "
                          f"give more of the id")
    if not ids:
        raise HrmctlError(f"no run '{ref}': {root}/ holds no runs (`hrmctl train` writes them there; --dir for "
                          f"another directory)")
    raise HrmctlError(f"no run '{ref}' in {root}/; nearest: {', '.join(nearest(stem, ids))}")


def is_running(path: Path) -> bool:
    return load_run(path).status in ACTIVE  # a queued Slurm job will run
