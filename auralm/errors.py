"""The error a user can act on: ``str(err)`` is the whole message, one line."""


class UserError(Exception):
    """Bad input (config, data, checkpoint): printed as ``error: ...``, exit status 2."""
