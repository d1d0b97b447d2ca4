"""Waiting in tests for something another process does: poll, and fail with what was awaited."""

from __future__ import annotations

import time

import pytest


def wait_for(predicate, timeout: float, what: str, show=lambda: "", every: float = 0.2):
    """``predicate()``'s first truthy value within ``timeout`` seconds; else the test fails naming ``what``,
    with ``show()`` (e.g. the output so far) below."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{show() or ''}".rstrip())
