"""`hrmctl init` (inventory.py: write hrmctl.toml, try SSH) and `hrmctl setup` (run.py: each node gets this checkout's
commit and a venv with this machine's packages and the torch build its hardware needs)."""
