"""`hrmctl doctor`: can these nodes train together? What exactly is wrong, and the fix.

command  the command's body: inventory -> run -> view, the exit code
run      probes every node in parallel (netcheck's probe over cli.nodes sessions) and runs netcheck's checks
view     the table (a `fix:` under every warning and failure) or --json

Flow: command -> run (a DoctorReport) -> view. May import: cli.nodes, cli.errors, netcheck.
"""
