"""The small non-causal transformer for ``task=sudoku`` (GPT's sizes): ``model.py`` the model, ``spec.py`` its
declaration."""
