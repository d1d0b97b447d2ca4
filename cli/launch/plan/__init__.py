"""The launch's first stage: what the user asked for (LaunchOptions), and the pieces of a plan made from it and from
what the nodes will say (each node's torchrun line, the memory estimate, the link advice, the dry run's time). Asks
no node. Imports no later stage (preflight, run, supervise); cli/launch/__init__.py lists the modules."""
