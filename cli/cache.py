"""hrmctl's cache on this machine: what a later command reuses to skip work (nodes' torch facts, the trainer's
verdicts on overrides and its model-size estimates, test-ddp's link figures, setup's sources and wheels).

Its directory is $HRMCTL_CACHE, else $XDG_CACHE_HOME/hrmctl, else ~/.cache/hrmctl. Its files are JSON objects,
written atomically (a temporary file renamed over the old one); one that cannot be read is empty, and one that
cannot be written only costs time. Standard library only: every command may import it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("HRMCTL_CACHE"):
        return Path(os.environ["HRMCTL_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "hrmctl"
    return Path("~/.cache/hrmctl").expanduser()


def load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(path: Path, entries: dict) -> bool:
    """Write ``entries`` to ``path`` in their order (a cache trimmed to its newest entries keeps the last ones
    inserted); False when it could not be written. A path that is a link is written through it: the file it names
    is replaced, and the link stays."""
    try:
        path = Path(os.path.realpath(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1) + "\n")
        os.replace(tmp, path)
        return True
    except OSError:
        return False
