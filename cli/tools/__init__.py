"""The trainer's tools as hrmctl commands: prepare-data, eval, solve, generate, export, validate-model.

One module per command holds its options, declared once with their help (Typer, as every command of cli/app.py,
which registers them); its body calls the typed function of auralm that does the work (a task's prepare in auralm.tasks,
auralm.tools.evaluate.evaluate_checkpoint, ...), imported only when the command runs: `hrmctl --help` and the other
commands never import torch. auralm's one-line UserError becomes hrmctl's (common.user_errors): `error: ...`, exit
code 2, as a usage error of any command.

    common.py          what the tools share: CHECKPOINT, --data, --json, and the errors
    prepare_data.py    `hrmctl prepare-data`, and the guides' spellings of its options, read before they are parsed
    evaluate.py        `hrmctl eval`
    solve.py           `hrmctl solve`
    generate.py        `hrmctl generate`
    export.py          `hrmctl export`
    validate_model.py  `hrmctl validate-model`
"""
