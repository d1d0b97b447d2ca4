"""Models that save and load like Hugging Face models: ``save_pretrained(dir)`` and ``from_pretrained(dir)``.

Every family (GPT, SudokuNet, the recurrent ACT models, RLMModel) mixes in :class:`Pretrained`::

    from auralm.models import RLMModel
    m = RLMModel.from_pretrained("runs/x/checkpoint-10")   # or the run directory: its newest whole checkpoint
    m.save_pretrained("out/")                              # config.yaml + model.safetensors, no optimizer
    RLMModel.from_pretrained("out/")                       # the same model, the same outputs

``from_pretrained`` accepts a ``checkpoint-<step>`` directory (falling back to the older checkpoints beside
it when it is not whole, as the trainer's resume does), a run directory (its newest whole checkpoint), or a
``save_pretrained`` directory. It reads ``config.yaml`` (an older checkpoint has none: then the config in
its ``state.json``), builds the model with :func:`auralm.models.build`, loads the weights, and returns it
in eval mode, on ``map_location``, with no training state. When the checkpoint kept EMA weights
(``training.ema=true``) those are the weights loaded, as ``hrmctl eval`` does (``use_ema=False``: the raw
ones). A sharded checkpoint (``training.parallel=fsdp``, a DCP directory) is read into the whole model in
this process, with no process group. Called on a family's class, a directory holding another family is refused with one
clear error;
``Pretrained.from_pretrained`` loads any family. :func:`auralm.tools.inference.load` is this same path.

A ``save_pretrained`` directory holds ``config.yaml`` ({task, family, model: the resolved arch,
vocab_size}), ``model.safetensors`` and ``checksums.json``, written like a checkpoint: into a temporary
directory, fsynced, renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch
import yaml

from auralm.training import checkpoint
from auralm.data.datadir import sha256_file
from auralm.errors import UserError
from auralm.models import registry
from auralm.models.args import ModelArgs

CONFIG, WEIGHTS, SUMS = "config.yaml", "model.safetensors", "checksums.json"
_OWN = {CONFIG, WEIGHTS, SUMS}


@dataclass
class Found:
    """What a directory holds: where the weights are, and how to build the model for them."""

    path: Path  # the checkpoint-<step> or save_pretrained directory the weights come from
    task: str
    arch: ModelArgs  # the resolved model section, as models.build takes it
    vocab_size: int | None
    saved: dict  # the config as saved: the run's resolved config, or save_pretrained's
    state: dict = field(default_factory=dict)  # state.json ({} for a save_pretrained directory)


def _is_pretrained(path: Path) -> bool:
    return (path / CONFIG).is_file() and (path / WEIGHTS).is_file() and not (path / "state.json").exists()


def _pretrained_problem(path: Path) -> str | None:
    """A save_pretrained directory: its files there, and matching checksums.json when it has one (a directory
    put together by hand, without checksums, is accepted as it is)."""
    if (path / SUMS).exists():
        return checkpoint.problem(path, required=(CONFIG, WEIGHTS))
    return None


def locate(path: str | os.PathLike) -> Found:
    """The model ``path`` holds: a save_pretrained directory, a checkpoint-<step> directory (or, when it is
    not whole, the newest whole one before it), or a run directory (its newest whole checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such checkpoint or run directory")
    if not path.is_dir():
        raise UserError(f"{path}: not a directory (give a run, checkpoint-<step> or save_pretrained directory)")
    if _is_pretrained(path):
        why = _pretrained_problem(path)
        if why:
            raise UserError(f"{path}: {why}")
        ckpt, state = path, {}
    else:
        found = checkpoint.candidates(path)
        if not found and (path / "state.json").exists():  # a checkpoint renamed by hand
            found = [path]
        whys = [(c, checkpoint.problem(c)) for c in found]
        ckpt = next((c for c, why in whys if why is None), None)
        if ckpt is None:
            detail = f": {whys[0][0].name}: {whys[0][1]}" if whys else ""
            raise UserError(f"{path}: no whole checkpoint-<step> directory there{detail} (is it a run, checkpoint "
                            f"or save_pretrained directory?)")
        state = None
    try:
        if state is None:
            state = json.loads((ckpt / "state.json").read_text())
        if (ckpt / CONFIG).exists():
            saved = yaml.safe_load((ckpt / CONFIG).read_text())
            vocab = saved.get("vocab_size", state.get("vocab_size"))
        else:  # a checkpoint from before config.yaml
            saved, vocab = state["config"], state.get("vocab_size")
        task, model = saved["task"], saved["model"]
        # the named size under the saved fields: a checkpoint from before a key existed gets its default
        arch = registry.args_from_saved(task, {"family": saved.get("family"), **model})
    except (KeyError, ValueError, TypeError, AttributeError, OSError, yaml.YAMLError, UserError) as e:
        raise UserError(f"{ckpt} is not a checkpoint auralm can load (no readable config: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return Found(ckpt, task, arch, vocab, saved, state)


def load(path: str | os.PathLike, use_ema: bool = True, map_location="cpu", expect: type | None = None):
    """(the model of ``path`` in eval mode, :class:`Found`); ``expect``: the class the model must be."""
    from auralm import models

    found = locate(path)
    family, klass = models.family_of(found.task, found.arch), models.class_of(found.task, found.arch)
    if expect is not None and expect is not Pretrained and not issubclass(klass, expect):
        raise UserError(f"{found.path} holds a model of family {family} (task={found.task}, class "
                        f"{klass.__name__}), not a {expect.__name__}: load it with {klass.__name__}.from_pretrained (or "
                        f"auralm.models.Pretrained.from_pretrained, any family)")
    try:
        model = models.build(found.task, found.arch, found.vocab_size)
        if checkpoint.is_sharded(found.path) and not (found.path / WEIGHTS).exists():  # training.parallel=fsdp
            checkpoint.load_dcp_model(found.path, model)
        else:
            safetensors.torch.load_model(model, str(found.path / WEIGHTS))
    except (KeyError, ValueError, TypeError, RuntimeError, OSError) as e:
        raise UserError(f"{found.path} is not a checkpoint auralm can load ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''})") from None
    ema = checkpoint.read_extra(found.path, "ema") if use_ema and found.state else None
    if ema:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n, v in ema.items():
                params[n].copy_(v)
    return model.to(map_location).eval(), found


class Pretrained:
    """``save_pretrained`` / ``from_pretrained`` for a model made by :func:`auralm.models.build`, which
    attaches ``config`` ({task, family, model: the resolved arch, vocab_size}) to what it builds."""

    config: dict

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, map_location="cpu", use_ema: bool = True):
        """The model saved in ``directory`` (a checkpoint-<step>, run or save_pretrained directory), in eval
        mode on ``map_location``; the checkpoint's EMA weights when it kept them and ``use_ema``."""
        return load(directory, use_ema, map_location, expect=cls)[0]

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write config.yaml, model.safetensors and checksums.json into ``directory``, whole or not at all.
        A directory holding anything else (a checkpoint, a run) is refused rather than replaced."""
        cfg = getattr(self, "config", None)
        if not isinstance(cfg, dict) or "task" not in cfg:
            raise ValueError(f"this {type(self).__name__} has no config: make it with auralm.models.build "
                             f"(or from_pretrained) to save it")
        final = Path(directory)
        if final.exists() and (not final.is_dir() or {p.name for p in final.iterdir()} - _OWN):
            raise UserError(f"{final}: exists and holds more than a saved model; save into a new or empty "
                            f"directory")
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".{final.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        (tmp / CONFIG).write_text(checkpoint.config_yaml(cfg))
        safetensors.torch.save_model(self, str(tmp / WEIGHTS))
        (tmp / SUMS).write_text(json.dumps({f: sha256_file(tmp / f) for f in (CONFIG, WEIGHTS)}, indent=2) + "\n")
        for f in tmp.iterdir():
            checkpoint._fsync(f)
        checkpoint._fsync(tmp)
        if final.exists():  # an earlier save_pretrained (or an empty directory): replaced whole
            old = final.parent / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
            shutil.rmtree(old)
        tmp.rename(final)
        checkpoint._fsync(final.parent)
        return final
