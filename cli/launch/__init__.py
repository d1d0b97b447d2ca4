"""`hrmctl train` and `hrmctl test-ddp`: torchrun on every node from one terminal.

command        the commands' bodies: options -> prepare (the plan) -> run -> the report
prepare        the preflight and the plan: trainer overrides checked, master address, node facts, the
               master port, writable directories, the backend, each node's torchrun line (--dry-run)
facts          each node's torch facts (probed or cached); plan: the per-node command and environment
storage        the data, run and checkpoint directories each node needs: writable, with free space
run            the plan run on every node: jobs started, watched, stopped everywhere (psutil on the
               node); restarts from the last checkpoint; a failed rank named, by its signal if killed
log            the merged live log (and runs/<run-id>/<node>.log)
ddp_report     test-ddp's table
node_torchrun  runs ON the node: checks a first launch's guessed facts, then torchrun in-process
nolibuv/       put on PYTHONPATH on a node whose TCPStore has no libuv

Flow: command -> prepare (a Prepared plan) -> run (a RunResult) -> command's report.
May import: cli.nodes, cli.sync (train --sync-data), cli.errors, netcheck. auralm is only started, as a process.
"""
