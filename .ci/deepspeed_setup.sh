#!/usr/bin/env bash
# Prepare DeepSpeed for suites/zero on a CPU-only machine, ahead of pytest:
#   - g++ (apt) and ninja (pip, into the interpreter's environment) for DeepSpeed's JIT op build;
#   - build DeepSpeed's deepspeed_shm_comm op once into the persistent cache
#     ~/.cache/pytest-nccl/torch_extensions/<py>-torch<v>-ds<v>-<hash> (45-110 s on 2 cores the
#     first time, ~3 s when cached). <hash> covers what makes ninja rebuild besides the sources:
#     the interpreter, its environment's paths (sys.prefix, torch's and DeepSpeed's install dirs),
#     CXX and the ninja binary; so each virtual environment gets its own directory. The build
#     writes that signature next to the op (pytest-nccl-build.json).
#     suites/zero/conftest.py computes the same directory (suites/zero/build_deepspeed_ops.py) and,
#     right after collection, builds it itself (outside any test's bound) whenever the op would
#     not load without a rebuild: stamp differs from this environment, ninja -n has work, or a
#     killed build left its lock. This script only moves that wait ahead of pytest.
# Usage (from .ci/run, before pytest):  bash .ci/deepspeed_setup.sh [PYTHON]
#   PYTHON defaults to $PYTHON, else .venv/bin/python, else python3. Run it with the interpreter
#   that will run pytest: another environment has another cache directory.
# Without DeepSpeed installed it only says so: the suite's DeepSpeed tests then skip.
# Environment the suite sets for itself (conftest.py), exported here only for other tools:
#   DS_ACCELERATOR=cpu, TORCH_EXTENSIONS_DIR=<the cache dir above> (kept when already set).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${1:-${PYTHON:-}}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi

if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"; then
  echo "deepspeed_setup: deepspeed is not installed for $PY; suites/zero's DeepSpeed tests will skip"
  exit 0
fi

if ! command -v g++ >/dev/null 2>&1; then
  echo "deepspeed_setup: installing g++"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
fi

BIN="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")"
if ! PATH="$BIN:$PATH" command -v ninja >/dev/null 2>&1; then
  echo "deepspeed_setup: installing ninja"
  "$PY" -m pip install -q ninja
fi

export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$("$PY" suites/zero/build_deepspeed_ops.py --print-dir)}"
export TORCH_EXTENSIONS_DIR
echo "deepspeed_setup: DS_ACCELERATOR=$DS_ACCELERATOR TORCH_EXTENSIONS_DIR=$TORCH_EXTENSIONS_DIR"
PATH="$BIN:$PATH" "$PY" suites/zero/build_deepspeed_ops.py --check || true   # says why it (re)builds
PATH="$BIN:$PATH" "$PY" suites/zero/build_deepspeed_ops.py                   # builds or loads; writes the stamp
