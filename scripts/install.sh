#!/usr/bin/env bash
# Make .venv with hrmctl and its test extra. torch is pinned to the CPU build first so that
# pip never reaches for a multi-GB CUDA build (the project declares a range 2.13.0 satisfies).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
fi
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import cli, torch; print('hrmctl', cli.__version__, 'torch', torch.__version__)"
