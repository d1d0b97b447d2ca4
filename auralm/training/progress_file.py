"""Every rank's latest progress in a small file on its own node, for `hrmctl top`.

Only rank 0 logs (auralm/training/runlog.py), so nothing on disk tells another rank's step and loss;
``write(d, record)``, called at the log site with the record that rank 0 writes to metrics.jsonl
(every rank builds it), fills that gap. It writes ``<dir>/<pid>.json``, where ``<dir>`` is
``$TMPDIR/hrmctl-top-<uid>`` (``/tmp/...`` without TMPDIR): one JSON object with the rank, world,
step, loss, steps per second since the previous beat, the record's own throughput, the bytes it sent in its last
round (DiLoCo's; else None), and the time.
Keyed by the process id, so two runs in one directory never mix, and the reader (node/sampler.py,
run by the same user) goes straight from a trainer process it found to its file. Written to a
temporary name and renamed, at most every MIN_GAP_S. A rank may end with os._exit (see
distributed.exit_process), so a file can outlive its process: the first beat of every process removes
the files of processes that no longer exist. A failure to write is ignored: training never depends on it.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path

MIN_GAP_S = 0.25  # at most four writes a second, however short a step is
_last: dict = {}  # the previous beat that was written: {"step", "t", "path"}


def directory() -> Path:
    """Where this user's trainer processes keep their progress files (node/sampler.py looks here too)."""
    base = os.environ.get("TMPDIR") or ("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir())
    uid = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(base) / f"hrmctl-top-{uid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: someone else's process, alive
        return True
    return True


def _clear_stale(folder: Path) -> None:
    for old in folder.glob("*.json*"):
        pid = old.name.split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                old.unlink()
            except OSError:
                pass


def write(d, record: dict) -> None:
    """This rank's progress, from the log record (step, loss, train_s, samples_per_s or tokens_per_s)."""
    try:
        now, step = time.time(), int(record["step"])
        if _last and now - _last["t"] < MIN_GAP_S:
            return
        if _last and now > _last["t"] and step >= _last["step"]:
            steps_per_s = (step - _last["step"]) / (now - _last["t"])
        else:  # the first beat: the run's average so far
            train_s = float(record.get("train_s") or 0)
            steps_per_s = step / train_s if train_s > 0 else None
        unit = "tokens" if "tokens_per_s" in record else "samples"
        loss = record.get("loss")
        doc = {"pid": os.getpid(), "rank": d.rank, "world": d.world, "local_rank": d.local_rank, "step": step,
               "loss": loss if isinstance(loss, (int, float)) and math.isfinite(loss) else None,
               "steps_per_s": steps_per_s, "rate": record.get(f"{unit}_per_s"), "unit": unit,
               "train_s": record.get("train_s"), "time": now, "run": os.environ.get("HRMCTL_RUN_ID"),
               "round_bytes": record.get("round_bytes")}
        path = _last.get("path")
        if path is None:
            folder = directory()
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            _clear_stale(folder)
            path = folder / f"{os.getpid()}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
        _last.update(step=step, t=now, path=path)
    except Exception:  # noqa: BLE001 - progress for a viewer must never stop training
        pass
