"""`hrmctl train` and `hrmctl test-ddp`: torchrun on every node from one terminal.

A launch flows one way, each stage given the one object the previous stage made (docs/train.md, "How a launch flows"),
a package per stage; command.py, here, is the entry that calls them in order:

  command.py        the commands' bodies: a guide's spellings read, the overrides checked; then the stages below
  plan/             what the user asked for, and what a plan is made of (no node asked yet):
    options.py        the command line read once into one LaunchOptions (the nodes selected, --env read), checked
    guide_options.py  a guide's options (`--batch_size 8`, `--gpus 2`) read as ours
    overrides.py      the trainer's own reading of the overrides (config files spelled out, its --check)
    plan.py           each node's exact torchrun line and environment (the LaunchPlan, NodeLaunch); pure
    min_nodes.py      training.elastic for the plan: the nodes a run keeps, whether a node leaves in place
    planner.py        the trainer's plan for a launch, asked of one process (auralm.planning.server) started at the
                      first question, beside the rest: the three below ask it
    memory.py         the model's memory estimate (auralm.planning.sizing) against each node's memory
    link_cache.py     test-ddp's figures for these nodes, and train's warning about the link
    timing.py         --dry-run's time: the trainer's probe and plan on this machine (auralm.planning.timing)
  preflight/        the nodes asked, at once over one connection per node, then the plan -> a LaunchPlan:
    prepare.py        the preflight and the plan, so that nothing starts anywhere when something is wrong
    node_facts.py     each node's torch facts (probed with netcheck, or cached)
    storage.py        the data, run and checkpoint directories each node needs: writable, with room (node/dirs.py)
    prestart.py       on a Slurm allocation's nodes, torchrun started (held) while the preflight runs
  run/              one attempt of the plan on every node -> a RunResult:
    attempt.py        jobs started, watched, stopped everywhere (psutil on the node); a failed rank named
    log.py            the merged live log (and runs/<run-id>/<node>.log)
    lost.py           what a node that stopped answering shows: its link down, its processes frozen or gone
    oom.py            whether the OOM killer took a rank that died of SIGKILL (the job's memory cgroup's count)
    save_stop.py      a stop that saves first (SIGUSR1, SIGTERM in a Slurm job): the ranks checkpoint, then end
  supervise/        the whole job, and what the user reads of it:
    job.py            attempt after attempt: restarts from the last checkpoint, the plan made again (a first launch's
                      guess wrong on a node, a node gone or back) -> the job's RunResult
    elastic.py        training.elastic: a node that leaves the run and comes back
    status.py         runs/<run-id>/status.json, from the job's start to its end
    detach.py         train --detach: this launcher started again as the run's supervisor, in a session of its
                      own; returns at the first step (before the stages: the supervisor runs them)
    report.py         --dry-run's plan, the run's last line or --json document; ddp_report.py: test-ddp's table

On the node: node/torchrun.py (checks a first launch's guessed facts, or waits held for its arguments, then torchrun
in-process) and nolibuv/ (put on PYTHONPATH where torch's TCPStore has no libuv).

A stage imports the ones before it (for their types) and never a later one (tests/unit/test_house_rules.py); the
stages' packages import nothing at import, so that a command loads only the stages it calls. May import:
cli.nodes, cli.sync (train --sync-data), cli.runs.catalog (detach.py: status.json read), cli.runs.states
(status.json's state), cli.errors, netcheck, node, and of auralm only what needs no torch at import (its config
parser, guide spellings, exit codes, link budget; auralm.data.datadir's preparer when the data is missing): the
trainer itself is started as a process, through torchrun.
"""
