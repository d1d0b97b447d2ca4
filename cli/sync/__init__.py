"""`hrmctl sync-data`: make a node's dataset match the local one over SSH.

run     sync_nodes(): per node, scan both sides, plan, send, verify, finalize; the SyncReport
plan    the transfers from the two scans (size + mtime or SHA-256); pure, no network
send    the client of the receiver (node/sync_receiver.py, sent to the node's Python: scan, mkdirs, put,
        finalize; never writes outside the root) (NodeAgent) and the pipelined SFTP sender of large files
sftp    pipelined SFTP writes; stream: small files in batches through the receiver
lane    a helper process with its own connection that shares the large files
view    the report as a table or --json

Flow: run -> plan -> send/stream/lane -> report (view). May import: cli.nodes, cli.errors, node.
"""
