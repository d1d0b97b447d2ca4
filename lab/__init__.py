"""The lab: real nodes made on this machine (network namespaces on a bridge, an OpenSSH server, a user and a
hostname per node), with real faults (shaped links, NFQUEUE delays, firewall rules, shifted clocks, CPU and memory
caps). Used by the cluster tier (tests/conftest.py, tests/cluster/) and by the benchmarks (bench/); it imports the
standard library only, never cli/, netcheck/ or auralm/.

nodes.py       Lab and LabNode: making, faulting and removing nodes (its docstring says how)
nfq_delay.py   the NFQUEUE delayer that shape_link uses where the kernel has no netem
local.py       nodes as processes here (torchrun agents on 127.0.0.1) and a node's process tree, for a SIGSTOP
forked_ranks.py  the suite's start-up: torchrun's ranks forked from its agent (site/sitecustomize.py on the suite's
               PYTHONPATH, SITE_DIR; a .pth file in the nodes' venv), never the product's
__main__.py    `python -m lab up N` / `python -m lab down TOKEN`
"""

from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "site"  # on PYTHONPATH, its sitecustomize.py runs forked_ranks.activate
