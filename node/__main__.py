"""``python -m node PROGRAM ARGS``: a node program from a checkout (the nodes get them sent: node/ship.py)."""

import sys

import node

node.end(node.main(sys.argv[1:]))
