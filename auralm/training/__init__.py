"""The training loop and its parts.

- ``train``: the run, ``Trainer`` (``python -m auralm.training.train``, alone or under torchrun): open the run, the
  data and the model, resume, then step, report, evaluate and save; the sync strategy (auralm.parallel) does the step.
- ``checkpoint_manager``: a run's checkpoints as stateful parts registered once (per rank or rank 0's), saved
  together and handed back on a resume; ``checkpoint`` writes and reads the files.
- ``config``: the run's keys, named sizes and checks; our own keys only.
- ``command_line``: a command line read into a config, the guides' spellings translated first (auralm.guides):
  what the trainer, the planning tools and the launcher's check (``python -m auralm.training.command_line``) call.
- ``distributed``: the process group, backend choice and collectives every rank calls together.
- ``checkpoint``, ``nan_guard``, ``ema``, ``optim``, ``precision``, ``objective``: what a step and a saved
  run are made of.
- ``faults``: the fault.* keys' injection (kill, sleep, NaN) as hooks around a strategy's step, for tests.
- ``budget``: the run's time before its first step (the probes: training speed, an evaluation batch), the ETA,
  and ``training.time_budget``, which sizes a fresh run of no given length.
- ``progress_file``, ``runlog``, ``tracking``, ``curves``: what a run says: its log, the trackers, the loss curves.

The parts (all but ``train`` and ``command_line``) may import ``auralm.errors``, ``models``, ``data`` and
``parallel.strategy`` (the registry, standard library); ``guides``, ``parallel`` and ``planning`` import the parts.
``command_line`` alone imports ``guides``; ``train`` alone imports ``parallel``, ``planning`` and ``tools`` (evaluate,
generate), and nothing imports ``train``.
"""
