"""How the ranks share the work of training, beyond plain DDP.

- ``balance``: each rank's share (``training.balance``): rows of the global batch under DDP, local steps
  per round under DiLoCo, in proportion to a node's weight or its measured speed.
- ``diloco``: low-communication training (``training.sync=diloco``): local steps, then one outer step
  on the averaged change of the weights.
- ``comm_hooks``: DDP's gradient compression (``training.ddp_comm_hook``).

Imports auralm's config and distributed helpers only; the trainer (auralm.train) drives them.
"""
