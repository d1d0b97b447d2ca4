"""GPT-2 for ``task=lm`` (the sizes tiny, mini, small, 124m): ``model.py`` the model, ``spec.py`` its declaration."""
