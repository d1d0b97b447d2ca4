"""Other projects' spellings, read as ours at the edge, before anything parses them (docs/guides.md).

- ``spellings``: the one table of the guides' spellings of keys, values, models and options, and the "did you mean"
  that reads it (standard library only: hrmctl's options read it without the trainer);
- ``translate``: a command line's ``key=value`` items (``config=FILE.yaml`` too) as our keys, each with how it was
  typed, and what the line implies beyond them;
- ``implied``: which guide keys name which model where the line names none, and the recipe a pasted ``pretrain.py``
  line follows.

The arrows point one way: this package imports the trainer's config, recipes and the model registry; nothing in
auralm imports it but auralm.training.command_line, the one way from a command line to a Config (and cli, for the
option spellings).
"""
