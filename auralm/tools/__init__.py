"""The tools for a trained model (``hrmctl eval``, ``solve``, ``generate``, ``export``, ``validate-model``).

- ``inference``: load a run's checkpoint or an exported model for the tools.
- ``evaluate``: loss and accuracy on a split (``python -m auralm.tools.evaluate``); the loop evaluates with it too.
- ``solve``: solve sudoku puzzles (``python -m auralm.tools.solve``).
- ``generate``: sample text (``python -m auralm.tools.generate``); the loop's samples use it too.
- ``export``: write a checkpoint as a pretrained folder (``python -m auralm.tools.export``).
- ``validate_model``: a config's model built and checked before a run (``python -m auralm.tools.validate_model``).

May import ``auralm.errors``, ``models``, ``data``, ``planning.sizing`` and training's parts (config, objective);
never ``training.train`` (which imports evaluate and generate from here) or ``parallel``.
"""
