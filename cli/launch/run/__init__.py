"""The launch's third stage: one attempt of the plan on every node (attempt.py), started, watched, stopped
everywhere, its failure named -> a RunResult. Imports the plan and preflight stages only of the stages;
cli/launch/__init__.py lists the modules."""
