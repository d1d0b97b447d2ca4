"""auralm: the trainer that torchrun starts on every node, in rooms.

- ``errors``: :class:`UserError`, the one-line refusal every room may raise (the only module at the root).
- ``kernels/``: the C kernel of mHC, built on first use.
- ``models/``: the model families (one folder each, declared once), the layers and loss they share, and which keys
  belong to which family.
- ``data/``: the data sets: sudoku generation, preparing text and sudoku splits, reading them into batches.
- ``tasks/``: the tasks (sudoku, lm), one folder each, declared once and registered by name: what a sample is,
  how it is scored, how a data directory's splits are read (the registry: standard library only).
- ``training/``: the loop (``python -m auralm.training.train``) and its parts: the run's config, distributed
  helpers, checkpoints, NaN guard, EMA, optimizer, precision, objective, logs, tracking and curves; and
  ``command_line``, the one way from a command line to a config.
- ``guides/``: other projects' spellings (the guides' keys, Hydra's ``+key``), translated into ours before the config
  reads a command line, and what a guide's line implies (its model, its paper's recipe).
- ``parallel/``: the sync strategies (single, DDP, DiLoCo, FSDP) behind one interface and one registry.
- ``planning/``: what is decided before a run: sizes and memory, batch_size=auto, the link budget, the DDP check.
- ``tools/``: the trained model's tools: evaluate, solve, generate, export, validate-model, and loading it.

The arrows point down this order: errors ← kernels ← models ← data ← tasks ← training's parts ← guides ←
training.command_line ← planning ← parallel ← tools ← training.train (the loop, which alone drives the strategies
and calls the tools' evaluate/generate).
Against that order, and said where they are: ``parallel.strategy`` (the registry, standard library only) is read by
training.config and planning, which ask a strategy class what it sends; ``models.pretrained`` reads training's
checkpoint and config to load a saved run. Each room's ``__init__`` says what it may import. auralm never imports
``cli`` or ``netcheck``; of ``node`` (standard library only, what runs on a node) planning.autobatch reads the
memory cgroup's figure.
"""
