"""A trained model from a checkpoint, on the CPU, with no training state: for eval, solve and scripts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from auralm.models import pretrained
from auralm.models.args import ModelArgs


@dataclass
class Loaded:
    model: torch.nn.Module
    task: str
    arch: ModelArgs
    data_dir: Path
    path: Path
    state: dict


def load(path: Path, use_ema: bool = True) -> Loaded:
    """The model of ``path`` (a checkpoint-<step> directory, or a run directory: its newest whole checkpoint,
    or a save_pretrained directory), in eval mode; with the EMA weights when the run kept them and ``use_ema``.
    The same path as ``from_pretrained`` (:mod:`auralm.models.pretrained`)."""
    model, found = pretrained.load(path, use_ema)
    data_dir = Path(found.saved.get("data_dir") or f"data/{found.task}")
    return Loaded(model, found.task, found.arch, data_dir, found.path, found.state)
