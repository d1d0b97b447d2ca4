"""The trainer's plan for a launch, asked of one process (auralm.planning.server, `python -m`): the model's size and
memory (memory.py), the link advice and DiLoCo's wire (link_cache.py), the dry run's time (timing.py). The process
starts at the launch's first question, at once, so that its `import torch` runs beside the launch's own work (the
nodes' handshakes and probes); it answers the questions in the order asked, and the launch closes it once planned
(a restart's plan starts one again). ``ask()`` returns at once; ``Answer.result()`` waits for the answer, up to the
question's time, and a launch that cannot wait goes on without it (``late``)."""

from __future__ import annotations

import atexit
import collections
import json
import subprocess
import sys
import threading


class Answer:
    """One question's answer: ``result()`` waits for it (the first call, up to ``timeout_s``), then keeps it."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.late = False  # not answered within timeout_s: the launch went on without it
        self.error = ""  # the process's one line when the question failed
        self._doc: dict | None = None
        self._arrived = threading.Event()
        self._waited = False

    def _set(self, doc: dict | None, error: str = "") -> None:
        self._doc, self.error = doc, error
        self._arrived.set()

    def result(self) -> dict | None:
        if not self._waited:
            self._waited = True
            self.late = not self._arrived.wait(self.timeout_s)
        return None if self.late else self._doc


class _Process:
    """One plan process and its questions not answered yet, in the order asked."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "auralm.planning.server"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.waiting: collections.deque[Answer] = collections.deque()
        self.lock = threading.Lock()
        self.last_err = ""
        self.ended = False
        self._err_reader = threading.Thread(target=self._stderr, daemon=True)
        self._err_reader.start()
        threading.Thread(target=self._answers, daemon=True).start()

    def ask(self, question: dict, answer: Answer) -> None:
        with self.lock:
            if self.ended:
                answer._set(None, self.last_err or "the plan's process ended")
                return
            self.waiting.append(answer)
            try:
                self.proc.stdin.write(json.dumps(question) + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):  # the process ended: the reader fails what waits
                pass

    def _answers(self) -> None:
        for line in self.proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                answer = self.waiting.popleft() if self.waiting else None
            if answer is not None:
                answer._set(doc.get("ok"), doc.get("error", ""))
        self.proc.wait()
        self._err_reader.join(timeout=5)  # its last line, the why of an end
        with self.lock:
            left, self.waiting, self.ended = list(self.waiting), collections.deque(), True
        for answer in left:
            answer._set(None, self.last_err or f"the plan's process ended (exit code {self.proc.returncode})")

    def _stderr(self) -> None:
        for line in self.proc.stderr:
            if line.strip():
                self.last_err = line.strip().removeprefix("error: ")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.kill()
        self.proc.wait()


_lock = threading.Lock()
_current: _Process | None = None


def ask(what: str, timeout_s: float, **question) -> Answer:
    """Ask the plan process (started now when none runs) ``what`` ("size", "time", "link") with ``question``'s
    fields (args, world, vocab, link); the answer comes in the background."""
    global _current
    answer = Answer(timeout_s)
    with _lock:
        try:
            if _current is None or _current.proc.poll() is not None:
                _current = _Process()
            process = _current
        except OSError as exc:
            answer._set(None, f"the plan's process could not start: {exc}")
            return answer
    process.ask({"ask": what, **question}, answer)
    return answer


def close() -> None:
    """The launch is planned: the process ends (a question asked later starts another)."""
    global _current
    with _lock:
        process, _current = _current, None
    if process is not None:
        process.close()


atexit.register(close)
