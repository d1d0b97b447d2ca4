"""A trained model from a checkpoint, on the CPU, with no training state: for eval, solve and scripts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

from auralm import checkpoint, config, models
from auralm.errors import UserError


@dataclass
class Loaded:
    model: torch.nn.Module
    task: str
    arch: dict
    data_dir: Path
    path: Path
    state: dict


def load(path: Path, use_ema: bool = True) -> Loaded:
    """The model of ``path`` (a checkpoint-<step> directory, or a run directory: its newest whole checkpoint),
    in eval mode; with the EMA weights when the run kept them and ``use_ema``."""
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint or run directory")
    for ckpt in checkpoint.candidates(path):
        if checkpoint.problem(ckpt) is None:
            break
    else:
        raise UserError(f"{path}: no whole checkpoint-<step> directory there (is it a run or checkpoint directory?)")
    try:
        state = json.loads((ckpt / "state.json").read_text())
        saved = state["config"]
        task, arch = saved["task"], {k: v for k, v in saved["model"].items() if k != "name"}
        model = models.build(task, dict(config.SIZES.get(saved["model"]["name"], {}), **arch), state.get("vocab_size"))
        safetensors.torch.load_model(model, str(ckpt / "model.safetensors"))
    except (KeyError, ValueError, TypeError, RuntimeError, OSError) as e:
        raise UserError(f"{ckpt} is not a checkpoint auralm can load ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    ema = checkpoint.read_extra(ckpt, "ema") if use_ema else None
    if ema:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n, v in ema.items():
                params[n].copy_(v)
    model.eval()
    data_dir = Path(saved.get("data_dir") or f"data/{task}")
    return Loaded(model, task, arch, data_dir, ckpt, state)
