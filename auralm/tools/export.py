"""Export a checkpoint as one model: ``python -m auralm.tools.export CHECKPOINT --out DIR`` (``hrmctl export``).

CHECKPOINT is a checkpoint-<step> directory or a run directory (its newest whole checkpoint), sharded
(``training.parallel=fsdp``: a torch.distributed.checkpoint directory written by any number of ranks) or
whole. The weights are gathered here, in this one process, with no process group, into the whole model on
the CPU, and written with ``save_pretrained``: DIR holds ``model.safetensors``, ``config.yaml`` and
``checksums.json``, loadable with ``auralm.models.Pretrained.from_pretrained(DIR)`` (no optimizer state).
When the run kept EMA weights those are exported, unless ``--raw``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from auralm.errors import UserError, exit_frozen


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(message)


def export(checkpoint: str | os.PathLike, out: str | os.PathLike, use_ema: bool = True):
    """Write the model of ``checkpoint`` into ``out`` (save_pretrained); (the path, the checkpoint it came from)."""
    from auralm.models.pretrained import load

    model, found = load(Path(checkpoint), use_ema=use_ema)
    return model.save_pretrained(out), found


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog=os.environ.get("AURALM_PROG", "python -m auralm.tools.export"),
                description="Gather a checkpoint (sharded or whole) into one model.safetensors and config.yaml.")
    p.add_argument("checkpoint", help="a checkpoint-<step> directory, or a run directory (its newest checkpoint)")
    p.add_argument("--out", required=True, help="the directory to write (new, or holding only a saved model)")
    p.add_argument("--raw", action="store_true", help="the raw weights even when the run kept EMA weights")
    try:
        a = p.parse_args(argv)
        path, found = export(a.checkpoint, a.out, use_ema=not a.raw)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    kind = "sharded" if (found.path / "dcp").is_dir() else "whole"
    step = found.state.get("step")
    print(f"exported {found.path} ({kind} checkpoint{f', step {step}' if step is not None else ''}) to {path}: "
          f"model.safetensors, config.yaml")
    return 0


if __name__ == "__main__":
    exit_frozen(main())
