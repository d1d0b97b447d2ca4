"""`hrmctl export`: a checkpoint, sharded or whole, as one model (auralm.tools.export.export)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.tools.common import Checkpoint, user_errors


def export(checkpoint: Checkpoint,
           out: Annotated[Path, typer.Option(
               metavar="DIR", show_default=False, help="The directory to write (new, or holding only a saved model).")],
           raw: Annotated[bool, typer.Option("--raw", help="The raw weights even when the run kept EMA weights.")]
           = False) -> int:
    """Gather a checkpoint (sharded or whole) into one model.safetensors and config.yaml for from_pretrained.

    A checkpoint sharded by training.parallel=fsdp is gathered here, in one process, on the CPU.
    When the run kept EMA weights those are exported, unless --raw."""
    with user_errors():
        from auralm.tools import export as tool

        path, found = tool.export(checkpoint, out, use_ema=not raw)
    print(tool.said(path, found))
    return 0
