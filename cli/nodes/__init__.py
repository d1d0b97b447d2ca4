"""The shared room: which nodes there are and how to reach them.

inventory  hrmctl.toml (and ~/.ssh/config) resolved into Node values
schema     the inventory's types and ranges (msgspec): one line per mistake
remote     SSH (paramiko) and local sessions: run, stream, put/get, known_hosts checked, argv quoted
view       `hrmctl nodes`: every node's resolved settings and their sources, `--check`

May import: cli.errors, the standard library, paramiko, rich, msgspec, and node (view: `--check` asks a node's
Python through the node agent). Every other room imports this one; it imports no other room.
"""
