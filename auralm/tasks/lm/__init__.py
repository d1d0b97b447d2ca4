"""task=lm: text, as windows of tokens of model.block_size from a tokenized corpus (hrmctl prepare-data)."""

from __future__ import annotations

from auralm.tasks import Task


class Text(Task):
    name = "lm"
    tokenized = True
    default_vocab = 32000
