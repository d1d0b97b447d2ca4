"""What is decided before a run, from the config and the cluster's figures.

- ``sizing``: parameters and memory of a config (``python -m auralm.planning.sizing``).
- ``autobatch``: ``batch_size=auto``, the largest batch that fits the device, with ``cpu_memory``.
- ``link_budget``: what each sync strategy sends per step over the measured link, and the advice
  (``python -m auralm.planning.link_budget``).
- ``timing``: a run's time on this machine before it starts, for ``hrmctl train --dry-run``
  (``python -m auralm.planning.timing``): the trainer's probe and plan (training.budget) on random rows.
- ``ddp_check``: ``hrmctl test-ddp``'s worker (``python -m auralm.planning.ddp_check`` under torchrun): a real
  collective across the nodes, checked and timed.

May import ``auralm.errors``, ``models``, ``parallel.strategy`` (the registry; link_budget asks the strategy class
it names what it sends per step), training's parts (config, distributed, objective, optim, precision) and
``training.command_line`` (a command line's keys, the guides' spellings too); never ``training.train`` or ``tools``.
"""
