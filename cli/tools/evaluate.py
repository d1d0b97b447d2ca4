"""`hrmctl eval`: a checkpoint's metrics on a split of its data (auralm.tools.evaluate.evaluate_checkpoint)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from cli.tools.common import Checkpoint, DataDir, JsonOut, user_errors


def Positive(text: str):
    return Annotated[Optional[int], typer.Option(min=1, show_default=False, help=text)]


def evaluate(checkpoint: Checkpoint, data: DataDir() = None,
             split: Annotated[str, typer.Option(help="The split to evaluate (val: the held-out puzzles).")] = "val",
             batches: Positive("Evaluate only this many batches (default: the whole split).") = None,
             batch_size: Annotated[int, typer.Option(min=1, help="Examples per batch.")] = 256,
             segments: Positive("HRM/TRM: segments to run (default: the model's halt_max_steps; more may solve "
                                "more).") = None,
             json_out: JsonOut = False) -> int:
    """Evaluate a checkpoint: exact and cell accuracy, halting, accuracy by number of segments.

    On the CPU, over the split of the data the run trained on (or --data DIR)."""
    import json

    with user_errors():
        from auralm.tools.evaluate import evaluate_checkpoint

        out = evaluate_checkpoint(checkpoint, data, split, batches, batch_size, segments)
    if json_out:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:22} {v:.4f}" if isinstance(v, float) else f"{k:22} {v}")
    return 0
