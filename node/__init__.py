"""What runs on a node before or beside training, standard library only (DESIGN.md's ``node/``).

    cgroups.py  what a process may use of its machine (CPUs, memory, the OOM killer's count): read by the node
                probe (netcheck/node_probe.py, sent with it) and by the trainer's batch_size=auto on the node

The node probe is sent to a node's Python as source (netcheck.node_probe_client.probe_source): the modules of this
package it imports are sent with it, put in ``sys.modules`` before it runs, so that nothing need be installed there.
The trainer (auralm) may import this package; it imports neither ``cli`` nor ``netcheck``.
"""
