"""`hrmctl train` and `hrmctl test-ddp`: torchrun on every node from one terminal.

command        the commands' bodies: options -> prepare -> run -> report
prepare        the preflight and the plan: trainer overrides checked, master address, node facts, the
               master port, the backend, each node's torchrun line (what --dry-run prints)
facts          each node's torch facts (probed or cached); plan: the per-node command and environment
run            the plan run on every node: jobs started, watched, stopped everywhere; restarts
log            the merged live log (and runs/<run-id>/<node>.log)
ddp_report     test-ddp's table
node_torchrun  runs ON the node: checks a first launch's guessed facts, then torchrun in-process
nolibuv/       put on PYTHONPATH on a node whose TCPStore has no libuv

Flow: command -> prepare (a Prepared plan) -> run (a RunResult) -> command's report.
May import: cli.nodes, cli.sync (train --sync-data), cli.errors, netcheck. auralm is only started, as a process.
"""
