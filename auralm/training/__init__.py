"""The training loop and its parts.

- ``train``: the loop (``python -m auralm.training.train``, alone or under torchrun): open the run, the data and
  the model, resume, then step, report, evaluate and save; the sync strategy (auralm.parallel) does the step.
- ``config``: the run's keys, named sizes, aliases and checks (``python -m auralm.training.config`` prints them).
- ``distributed``: the process group, backend choice and collectives every rank calls together.
- ``checkpoint``, ``nan_guard``, ``ema``, ``optim``, ``precision``, ``objective``: what a step and a saved
  run are made of.
- ``faults``: the fault.* keys' injection (kill, sleep, NaN) as hooks around a strategy's step, for tests.
- ``budget``: the run's time before its first step (the probes: training speed, an evaluation batch), the ETA,
  and ``training.time_budget``, which sizes a fresh run of no given length.
- ``progress_file``, ``runlog``, ``tracking``, ``curves``: what a run says: its log, the trackers, the loss curves.

The parts (all but ``train``) may import ``auralm.errors``, ``models``, ``data`` and ``parallel.strategy`` (the
registry, standard library); ``parallel`` and ``planning`` import the parts. ``train`` alone imports ``parallel``,
``planning`` and ``tools`` (evaluate, generate), and nothing imports ``train``.
"""
