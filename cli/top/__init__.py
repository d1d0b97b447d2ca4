"""`hrmctl top`: every node's CPU, memory, GPU and network, and the running job's ranks, live.

watch    one channel per node kept open (cli.nodes sessions), a thread each reading the lines of the sampler
         (node/sampler.py, sent by node.ship: standard library; psutil and pynvml when present, else /proc and no
         GPU; one JSON line per interval on stdout until its stdin closes)
view     the rich tables (nodes; ranks with the slowest marked) and the --json document
command  the command's body: inventory -> watch -> a live view with single-key input, --once, --json

Flow: command -> watch (sampler on every node) -> view. May import: cli.nodes, cli.errors, node.
The trainer's side is auralm/training/progress_file.py (each rank's step, loss and rate in a small file).
"""
