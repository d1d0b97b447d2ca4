"""A planning process of the trainer's (``python -m auralm.planning.X ... `` printing one JSON document) started at
once, beside the launch's own work (the preflight, the size estimate); ``result()`` waits for it, briefly: what the
link advice (link_cache.py) and the dry run's time (timing.py) run."""

from __future__ import annotations

import json
import subprocess
import sys


class Aside:
    def __init__(self, argv: list[str], timeout_s: float):
        self.timeout_s = timeout_s
        self.proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._result: dict | None = None
        self._done = False
        self.late = False  # not answered within timeout_s: the launch went on without it
        self.error = ""  # its last line on stderr when it failed

    def result(self) -> dict | None:
        if not self._done:
            self._done = True
            try:
                out, err = self.proc.communicate(timeout=self.timeout_s)
                if self.proc.returncode == 0:
                    self._result = json.loads(out)
                else:
                    self.error = (err.strip().splitlines() or [""])[-1].removeprefix("error: ")
            except (subprocess.TimeoutExpired, ValueError) as e:
                self.late = isinstance(e, subprocess.TimeoutExpired)
                self.proc.kill()
                self.proc.communicate()
        return self._result
