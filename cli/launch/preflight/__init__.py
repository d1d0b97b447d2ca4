"""The launch's second stage: every node asked at once, over one connection each (torch facts, directories, the
master port), then the plan -> a LaunchPlan (prepare.py), so that nothing starts anywhere when something is wrong.
Imports the plan stage only of the stages; cli/launch/__init__.py lists the modules."""
