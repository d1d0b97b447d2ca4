"""hrmctl: one terminal for a small training cluster on a LAN.

The rooms, one package per command, beside the shared one:

    app.py     the Typer command line: every command's options and help; each body imports its room
    nodes/     shared: the inventory (hrmctl.toml), SSH sessions, and `hrmctl nodes`
    doctor/    `hrmctl doctor`
    sync/      `hrmctl sync-data`
    launch/    `hrmctl train` and `hrmctl test-ddp`
    errors.py  the one-line errors and their exit codes; fast_start.py: less fixed cost per process

`prepare-data`, `eval` and `solve` are the trainer's own tools (auralm.data.datadir, auralm.tools.evaluate,
auralm.tools.solve), run as processes. Arrows point one way: app -> a command's room -> nodes -> errors;
rooms use netcheck; nothing here imports auralm (it is started as a process).
"""

__version__ = "0.1.0"
