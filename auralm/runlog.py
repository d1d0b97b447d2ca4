"""What rank 0 reports: lines on stdout, and ``config.json``, ``metrics.jsonl``, ``events.jsonl`` in the run directory.

On every other rank a RunLog is silent, so the trainer can call it without asking who it is.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


class RunLog:
    def __init__(self, out_dir: Path | None):
        self.out_dir = out_dir  # None: not rank 0

    def say(self, line: str, err: bool = False) -> None:
        if self.out_dir is not None:
            print(line, file=sys.stderr if err else sys.stdout, flush=True)

    def _append(self, name: str, record: dict) -> None:
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / name, "a") as f:
                f.write(json.dumps(record) + "\n")

    def config(self, cfg: dict) -> None:
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    def metrics(self, record: dict) -> None:
        self._append("metrics.jsonl", record)

    def event(self, step: int, kind: str, message: str, rank: int | list[int] = 0, **fields) -> None:
        """One line on stdout and one record in events.jsonl: step, kind, rank(s), what was done."""
        self.say(message)
        self._append("events.jsonl", {"step": step, "kind": kind, "rank": rank, "message": message, **fields})
