"""The model families, one folder each, declared once in its ``spec.py`` and registered by name in
:mod:`auralm.models.registry`; :func:`build` makes the model of a resolved ``arch`` (the family's typed args: ``args``).

- ``gpt/``: GPT-2 for ``task=lm`` (the sizes tiny, mini, small, 124m);
- ``transformer/``: a small non-causal transformer for ``task=sudoku`` (the same sizes);
- ``rlm/``: the RLM-mHC guide's transformer for ``task=lm`` (RMSNorm, rotary, SwiGLU), with
  manifold-constrained hyper-connections (``mhc``) unless ``mhc_enabled=false``;
- ``hrm/``, ``trm/``: the recurrent reasoning models, on sudoku and (causal) on text, trained with ACT
  (``act``: the carry, deep supervision and halting they share; ``recurrent``: the keys and checks they share);
- ``layers``: what the families share; ``chunked_loss``: the heads' cross-entropy a chunk of tokens at a time;
- ``args``: what a family's model reads, typed (each family's args class, in its ``spec.py``);
- ``families``: which ``model.*`` keys belong to which family;
- ``pretrained``: ``save_pretrained`` / ``from_pretrained`` (the :class:`Pretrained` mixin every family has);
  :func:`build` attaches ``model.config`` ({task, family, model: the arch, vocab_size}) for them.

May import ``auralm.errors`` and ``auralm.kernels``; ``pretrained`` alone also reads training's checkpoint and config
and data's checksum, to load a saved run. Importing this package imports no torch (``auralm.training.config`` reads the
registry's sizes without it); the classes
below are imported when first asked for.
"""

from __future__ import annotations

import importlib

from auralm.models import registry
from auralm.models.args import ModelArgs

__all__ = ["ACT", "Carry", "GPT", "Pretrained", "RLMModel", "SudokuNet", "build", "class_of", "family_of"]
_LAZY = {"ACT": "auralm.models.act", "Carry": "auralm.models.act", "GPT": "auralm.models.gpt.model",
         "Pretrained": "auralm.models.pretrained", "RLMModel": "auralm.models.rlm.model",
         "SudokuNet": "auralm.models.transformer.model"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'auralm.models' has no attribute {name!r}")


def family_of(task: str, arch: ModelArgs) -> str:
    return registry.of(task, arch).name


def class_of(task: str, arch: ModelArgs) -> type:
    """The class :func:`build` makes for ``task`` and ``arch``."""
    return registry.of(task, arch).model_class(task, arch)


def build(task: str, arch: ModelArgs, vocab_size: int | None = None):
    """The model of ``task`` and ``arch`` (an ``nn.Module``), with ``model.config`` = {task, family, model: arch,
    vocab_size} (what ``save_pretrained`` writes and ``from_pretrained`` builds from); ``arch``: the family's args
    (auralm.models.args)."""
    family = registry.of(task, arch)
    model = family.build(task, arch, vocab_size)
    model.config = {"task": task, "family": family.name, "model": arch.to_dict(), "vocab_size": vocab_size}
    return model
