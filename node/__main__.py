"""``python -m node PROGRAM ARGS``: a node program from a checkout (the torchrun wrapper; the others are sent to the
nodes by node/ship.py), through the one dispatch, ending as an interpreter ends."""

import sys

import node

sys.exit(node.main(sys.argv[1:]))
