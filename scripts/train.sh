#!/usr/bin/env bash
# The main job on its embedded default: install into .venv, then train on this machine alone.
# Extra arguments go to `hrmctl train` (for example: --nodes node0,node1 training.max_steps=500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/hrmctl train "$@"
