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
# The installer: uv (installed into .venv by pip, 17 MB) where it runs, else pip. uv unpacks into its cache once and
# links from it: a warm `install.sh test` into a new clone 66 -> 30 s here, 22 s of it the bytecode below (2026-12-07;
# docs/setup.md has the cold figures). uv does not read pip's configuration: its sources (index-url, extra-index-url,
# find-links, constraint, no-index; config files and PIP_* variables) are handed to it here, and a package uv
# cannot install is installed by pip after all.
# --no-compile (pip; uv compiles nothing by default): bytecode is written below, torch's beside the rest's install,
# the rest's on every core at the end (compiled). Without bytecode, every process would compile what it imports
# again where PYTHONDONTWRITEBYTECODE is set, 10 s and more for `import torch`.
PIP=(.venv/bin/pip install -q --disable-pip-version-check --no-compile)
quiet() { grep -v "^WARNING: Location" || true; }
UV=() UV_VERSION=$(sed -n 's/^UV_VERSION = "\([^"]*\)".*/\1/p' cli/setup/local.py)  # the one hrmctl setup sends
if [ "${HRMCTL_INSTALLER:-uv}" = uv ] && { [ -x .venv/bin/uv ] || "${PIP[@]}" "uv==$UV_VERSION" 2>/dev/null | quiet; } \
   && .venv/bin/uv --version >/dev/null 2>&1; then
  UV=(.venv/bin/uv pip install -q --python .venv/bin/python --index-strategy unsafe-best-match)
  while IFS= read -r line; do  # pip config list: `global.find-links='/opt/wheels'`, `:env:.index-url='...'`
    key=${line%%=*} value=${line#*=}
    value=${value#\'} value=${value%\'}
    case "${key#*.}" in
      index-url) UV+=(--index-url "$value") ;;
      extra-index-url) for v in $value; do UV+=(--extra-index-url "$v"); done ;;
      find-links) for v in $value; do UV+=(--find-links "$v"); done ;;
      constraint|constraints) for v in $value; do UV+=(--constraint "$v"); done ;;
      no-index) case "$value" in 1|true|yes|on) UV+=(--no-index) ;; esac ;;
    esac
  done < <(.venv/bin/pip config list 2>/dev/null)
fi
install() {  # pip install's arguments: by uv where it is here, else (or when uv fails) by pip
  if [ ${#UV[@]} -gt 0 ]; then
    local log
    log=$(mktemp)
    if "${UV[@]}" "$@" >"$log" 2>&1; then rm -f "$log"; return 0; fi
    echo "uv could not install $*: pip instead ($(tail -n 1 "$log"))"
    rm -f "$log"
  fi
  "${PIP[@]}" "$@" 2>&1 | quiet
  return "${PIPESTATUS[0]}"
}
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
# bytecode for a directory, on $2 cores (0: all); a file that does not compile is the package's own (pip ignores it too).
# Not for transformers' 400-odd model folders (2,700 of its 2,900 files; 7 CPU-s): hrmctl uses its tokenizers, which
# import models/auto and models/encoder_decoder only (a module left out is compiled when something imports it)
SKIP_BYTECODE='transformers/models/(?!(auto|encoder_decoder|gpt2)/|__init__)'
compiled() { .venv/bin/python -m compileall -q -j "${2:-0}" -x "$SKIP_BYTECODE" "$1" >/dev/null 2>&1 || true; }

torch_new=""
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  mapfile -t choice < <(.venv/bin/python cli/setup/torch_build.py "$TORCH_VERSION")
  tag=${choice[0]} index=${choice[1]}
  echo "torch $TORCH_VERSION+$tag: ${choice[2]}"
  if .venv/bin/python - "$index/" "$INDEX_TIMEOUT" <<'EOF' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).close()
EOF
    echo "torch from $index"
    install --extra-index-url "$index" "torch==$TORCH_VERSION+$tag"
  else
    echo "torch from the configured index ($index cannot be reached within ${INDEX_TIMEOUT}s)"
    install "torch==$TORCH_VERSION+$tag" \
      || { echo "torch $TORCH_VERSION+$tag is not in the configured index: torch==$TORCH_VERSION from it instead"
           install "torch==$TORCH_VERSION"; }
  fi
  # its files are there (imported once compiled, below): else the rest's install would pull torch from PyPI
  .venv/bin/python -c "import importlib.metadata as m; m.version('torch')" 2>/dev/null \
    || { echo "error: torch $TORCH_VERSION+$tag did not install; see above" >&2; exit 1; }
  compiled "$SITE/torch" 1 &  # beside the rest's install
  torch_new=$!
fi
if [ "$EXTRAS" = test ]; then
  install -e '.[test]'
else
  install -e .
fi
[ -z "$torch_new" ] || wait "$torch_new"
compiled "$SITE"
.venv/bin/python -W ignore -c "import cli, torch; print('hrmctl', cli.__version__, 'torch', torch.__version__)" \
  || { echo "error: hrmctl or torch $TORCH_VERSION does not import in .venv; see above" >&2; exit 1; }
