"""How the ranks train together: the sync strategies, one class each behind one interface and one registry.

- ``strategy``: the interface (``Strategy``), what a strategy trains with (``Training``: the trainer) and the registry
  that ``training.sync``/``training.parallel`` names are looked up in (``register``, ``choose``, ``make``);
  standard library only, so config.py and link_budget.py read it without torch.
- ``single``: one process (``training.sync=ddp`` alone): the step every other strategy builds on.
- ``ddp``: DistributedDataParallel over several ranks, with ``comm_hooks`` (``training.ddp_comm_hook``).
- ``diloco_strategy``: rounds of local steps and an outer step (``training.sync=diloco``), with the
  algorithm in ``diloco``.
- ``fsdp_strategy``: the model sharded over the ranks (``training.parallel=fsdp``), with ``fsdp``.
- ``balance``: each rank's share (``training.balance``): rows of the global batch under DDP, local steps
  per round under DiLoCo, in proportion to a node's weight or its measured speed.

Imports auralm.models, auralm.data (the batches), training's parts (config, distributed, checkpoint, objective,
optim, precision) and planning.link_budget's DiLoCo constants; never auralm.training.train, which drives
the strategies through the interface alone.
"""
