"""The one error type a user sees: a single line that says what is wrong and what to do."""

from __future__ import annotations


class HrmctlError(Exception):
    """A failure the user can act on. ``str(err)`` is the whole message: one line, with the fix."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InventoryError(HrmctlError):
    """The inventory or a node selection is wrong."""


class RemoteError(HrmctlError):
    """A node could not be reached or a command on it could not be run. The message begins with the node's name
    and a colon (cli/launch/supervise/elastic.py reads which node it was from there)."""

    exit_code = 3


class HostKeyError(RemoteError):
    """The node's host key is unknown or has changed."""


class AuthError(RemoteError):
    """The node refused our credentials."""


class UnreachableError(RemoteError):
    """Nothing answered at the node's address in time."""


class RemoteTimeout(RemoteError):
    """A command on a node did not finish in time (it was stopped)."""
