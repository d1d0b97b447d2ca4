"""What the trainer's tools share: the CHECKPOINT argument, --data and --json, and auralm's errors as hrmctl's."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.errors import HrmctlError

Checkpoint = Annotated[Path, typer.Argument(
    metavar="CHECKPOINT", show_default=False,
    help="A checkpoint-<step> directory, a run directory (its newest whole checkpoint) or an exported model.")]


def DataDir(text: str = "The data directory (default: the one the run trained on)."):
    return Annotated[Optional[Path], typer.Option("--data", metavar="DIR", show_default=False, help=text)]


JsonOut = Annotated[bool, typer.Option("--json", help="One JSON object on stdout, for scripts.")]


@contextmanager
def user_errors():
    """auralm's UserError (bad input: a config, data, a checkpoint) as hrmctl's one line, exit code 2."""
    from auralm.errors import UserError

    try:
        yield
    except UserError as e:
        raise HrmctlError(str(e)) from None
