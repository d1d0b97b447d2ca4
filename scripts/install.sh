#!/usr/bin/env bash
# Make .venv with hrmctl: `bash scripts/install.sh` for training (no test extras), `bash scripts/install.sh test`
# for the tests too. torch goes in first, in the build this machine's hardware needs (cli/setup/torch_build.py,
# the same choice `hrmctl setup` makes for a node): the CUDA build the driver runs where nvidia-smi shows an
# NVIDIA GPU, else the CPU build from PyTorch's CPU index (or, when that cannot be reached within a few seconds,
# from the configured index), so pip never pulls a multi-GB CUDA build onto a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=2.13.0
EXTRAS=${1:-}
INDEX_TIMEOUT=5

if ! "$PY" -c "import venv, ensurepip" 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing python3-venv (apt-get): $PY has no venv/ensurepip"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }
  else
    echo "error: $PY has no venv module; install it first: sudo apt-get install -y python3-venv (Debian/Ubuntu)," \
         "sudo dnf install -y python3 (Fedora)" >&2
    exit 2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
PIP=(.venv/bin/pip install -q --disable-pip-version-check)
quiet() { grep -v "^WARNING: Location" || true; }

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  mapfile -t choice < <(.venv/bin/python cli/setup/torch_build.py "$TORCH_VERSION")
  tag=${choice[0]} index=${choice[1]}
  echo "torch $TORCH_VERSION+$tag: ${choice[2]}"
  if .venv/bin/python - "$index/" "$INDEX_TIMEOUT" <<'EOF' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).close()
EOF
    echo "torch from $index"
    "${PIP[@]}" --extra-index-url "$index" "torch==$TORCH_VERSION+$tag" 2>&1 | quiet
  else
    echo "torch from the configured index ($index cannot be reached within ${INDEX_TIMEOUT}s)"
    "${PIP[@]}" "torch==$TORCH_VERSION+$tag" 2>&1 | quiet \
      || { echo "torch $TORCH_VERSION+$tag is not in the configured index: torch==$TORCH_VERSION from it instead"
           "${PIP[@]}" "torch==$TORCH_VERSION" 2>&1 | quiet; }
  fi
  .venv/bin/python -W ignore -c "import torch" || { echo "error: torch $TORCH_VERSION+$tag did not install; see above" >&2; exit 1; }
fi
if [ "$EXTRAS" = test ]; then
  "${PIP[@]}" -e '.[test]' 2>&1 | quiet
else
  "${PIP[@]}" -e . 2>&1 | quiet
fi
.venv/bin/python -c "import cli, torch; print('hrmctl', cli.__version__, 'torch', torch.__version__)"
