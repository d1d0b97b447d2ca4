"""hrmctl: one terminal for a small training cluster on a LAN.

The rooms, one package per command, beside the shared one:

    app.py     the Typer command line: every command's options and help; each body imports its room
    nodes/     shared: the inventory (hrmctl.toml), SSH sessions, and `hrmctl nodes`
    doctor/    `hrmctl doctor`
    sync/      `hrmctl sync-data`
    launch/    `hrmctl train` and `hrmctl test-ddp`
    tools/     the trainer's tools: `hrmctl prepare-data`, `eval`, `solve`, `generate`, `export`, `validate-model`
    errors.py  the one-line errors and their exit codes; fast_start.py: less fixed cost per process

The trainer's tools are hrmctl commands like the others (cli/tools/ holds their options); each runs auralm's typed
function for it (a task's prepare, auralm.tools.evaluate.evaluate_checkpoint ...) in this process, imported
only when the command runs. Arrows point one way: app -> a command's room -> nodes -> errors; rooms use netcheck;
training itself is auralm's, started as a process (torchrun), and what the rooms read of auralm imports no torch.
"""

__version__ = "0.1.0"
