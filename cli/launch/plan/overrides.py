"""The trainer's own reading of a launch's overrides, made here before anything starts on any node: config files
spelled out (``config=FILE.yaml``) and the trainer's --check, both by its parser run as a process without torch
(`python -m auralm.training.command_line`); a verdict "valid" cached by ``trainer_key``, the key of everything the
trainer's code decides for the launcher (memory.py's estimates too). Imported by the command before it submits
or plans, so nothing of the preflight is loaded for a run sent to Slurm.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

from cli.errors import HrmctlError
from cli.cache import cache_dir, load as load_cache, save as save_cache
from cli.launch.plan.options import TRAINER

TRAINER_CHECK = "auralm.training.command_line"  # the trainer's --check without `import torch`: a tenth of the time
TRAINER_CHECKS = cache_dir() / "trainer-checks.json"


def trainer_key(*what) -> str | None:
    """A cache key for something the trainer's code decides: this Python, ``what``, and the trainer's source (every
    file's name, size and mtime, in all of auralm's folders). None when the trainer is not installed here."""
    spec = importlib.util.find_spec("auralm")
    if spec is None or not spec.submodule_search_locations:
        return None
    h = hashlib.sha256(json.dumps([sys.executable, *what], sort_keys=True, default=str).encode())
    root = Path(list(spec.submodule_search_locations)[0])
    for path in sorted(root.rglob("*.py")):
        st = path.stat()
        h.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def check_trainer_args(module: str, args: list[str]) -> None:
    """The trainer's parser validates its overrides here, before anything starts on any node. A
    verdict "valid" is remembered; a rejection is never cached."""
    if module != TRAINER:
        return
    key = trainer_key(args)
    if key and key in load_cache(TRAINER_CHECKS):
        return
    _run_trainer_check(args)
    if key:
        passed = load_cache(TRAINER_CHECKS)
        passed[key] = time.time()
        save_cache(TRAINER_CHECKS, dict(sorted(passed.items(), key=lambda kv: kv[1])[-200:]))


def expand_config_files(module: str, args: list[str]) -> list[str]:
    """``config=FILE.yaml`` spelled out into its key=value settings by the trainer's own reader (run here, as a
    process: `python -m auralm.training.command_line --expand`), so the file need only exist on this machine."""
    if module != TRAINER or not any(a.partition("=")[0].strip().lstrip("+") == "config" for a in args):
        return args
    try:
        res = subprocess.run([sys.executable, "-m", TRAINER_CHECK, "--expand", *args], capture_output=True,
                             text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise HrmctlError(f"`python -m {TRAINER_CHECK} --expand` did not answer in 120 s; run it by hand to see why")
    if res.returncode != 0:
        lines = (res.stderr.strip() or f"exit code {res.returncode}").splitlines()
        raise HrmctlError(f"trainer overrides rejected: {lines[-1].removeprefix('error: ')}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _run_trainer_check(args: list[str]) -> None:
    try:
        res = subprocess.run([sys.executable, "-m", TRAINER_CHECK, "--check", *args], capture_output=True,
                             text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise HrmctlError(f"`python -m {TRAINER_CHECK} --check` did not answer in 120 s; run it by hand to see why")
    if res.returncode == 0:
        return
    lines = (res.stderr.strip() or res.stdout.strip() or f"exit code {res.returncode}").splitlines()
    msg = lines[-1].removeprefix("error: ")
    if "No module named" in msg and "auralm" in msg:
        msg = f"the trainer {TRAINER} is not installed here; install the project (scripts/install.sh)"
    raise HrmctlError(f"trainer overrides rejected: {msg}")
