"""What is decided before a run, from the config and the cluster's figures.

- ``sizing``: parameters and memory of a config (``python -m auralm.planning.sizing``).
- ``autobatch``: ``batch_size=auto``, the largest batch that fits the device, with ``cpu_memory``.
- ``link_budget``: what each sync strategy sends per step over the measured link, and the advice.
- ``timing``: a run's time on this machine before it starts, for ``hrmctl train --dry-run``: the trainer's probe
  and plan (training.budget) on random rows.
- ``server``: the launcher's plan process (``python -m auralm.planning.server``), one a launch: sizing's, timing's and
  link_budget's answers to the launcher's questions, with torch imported once.
- ``ddp_check``: ``hrmctl test-ddp``'s worker (``python -m auralm.planning.ddp_check`` under torchrun): a real
  collective across the nodes, checked and timed.

May import ``auralm.errors``, ``models``, ``parallel.strategy`` (the registry; link_budget asks the strategy class
it names what it sends per step), training's parts (config, distributed, objective, optim, precision) and
``training.command_line`` (a command line's keys, the guides' spellings too); never ``training.train`` or ``tools``.
"""
