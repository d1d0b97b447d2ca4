"""Export a checkpoint as one model: ``hrmctl export CHECKPOINT --out DIR`` (its options: cli/tools/export.py).

CHECKPOINT is a checkpoint-<step> directory or a run directory (its newest whole checkpoint), sharded
(``training.parallel=fsdp``: a torch.distributed.checkpoint directory written by any number of ranks) or
whole. The weights are gathered here, in this one process, with no process group, into the whole model on
the CPU, and written with ``save_pretrained``: DIR holds ``model.safetensors``, ``config.yaml`` and
``checksums.json``, loadable with ``auralm.models.Pretrained.from_pretrained(DIR)`` (no optimizer state).
When the run kept EMA weights those are exported, unless ``--raw``.
"""

from __future__ import annotations

import os
from pathlib import Path


def export(checkpoint: str | os.PathLike, out: str | os.PathLike, use_ema: bool = True):
    """Write the model of ``checkpoint`` into ``out`` (save_pretrained); (the path, the checkpoint it came from)."""
    from auralm.models.pretrained import load

    model, found = load(Path(checkpoint), use_ema=use_ema)
    return model.save_pretrained(out), found


def said(path: Path, found) -> str:
    """The line that says what ``export`` wrote: from which checkpoint (sharded or whole, its step), to where."""
    kind = "sharded" if (found.path / "dcp").is_dir() else "whole"
    step = found.state.get("step")
    return (f"exported {found.path} ({kind} checkpoint{f', step {step}' if step is not None else ''}) to {path}: "
            f"model.safetensors, config.yaml")
