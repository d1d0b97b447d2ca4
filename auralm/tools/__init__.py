"""The tools for a trained model (``hrmctl eval``, ``solve``, ``generate``, ``export``, ``validate-model``).

Each is a typed function here; its command line (options, help, completion, errors) is hrmctl's, in cli/tools/.

- ``inference``: load a run's checkpoint or an exported model for the tools.
- ``evaluate``: loss and accuracy on a split (``evaluate_checkpoint``: hrmctl eval); the loop evaluates with it too.
- ``solve``: solve sudoku puzzles (``solve_file``: hrmctl solve).
- ``generate``: sample text (``continue_prompt``: hrmctl generate); the loop's samples use it too.
- ``export``: write a checkpoint as a pretrained folder (``export``: hrmctl export).
- ``validate_model``: a config's model built and checked before a run (``check``: hrmctl validate-model).

May import ``auralm.errors``, ``models``, ``data``, ``planning.sizing``, training's parts (config, objective) and
``training.command_line``;
never ``training.train`` (which imports evaluate and generate from here) or ``parallel``.
"""
