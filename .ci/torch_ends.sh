#!/usr/bin/env bash
# The ends of the supported torch range (README "Support range"), each in a venv of its own: the
# project's tests of the tracer, functional collectives, side groups, the watch's start-up hook,
# SPMD and the fork server, then `pytest --nccl-world=2 suites/launch suites/modern`; on an end before
# torch 2.10, OpenRLHF 0.6.1's own weight-sync group (tests/test_openrlhf_group.py, test_watch_side_group.py).
# .ci/run calls it with a smaller TORCH_ENDS_TESTS; TORCH_ENDS overrides the versions.
# torch comes from PyPI (CUDA builds, ~4.6 GB installed, they run on CPU) or TORCH_INDEX_URL. A
# machine whose pip configuration caps torch (/etc/xdg/pip's constraint file) is overridden through
# PIP_CONSTRAINT=/dev/null (the environment beats pip's configuration files; `--isolated` and an
# empty PIP_CONSTRAINT do not lift it, measured with pip 23.2): no system file is edited.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_CONSTRAINT=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
ENDS=${TORCH_ENDS:-"2.6.0 2.15.0"}
ROOT=${TORCH_ENDS_DIR:-.ci-torch-ends}
ROOT=$(mkdir -p "$ROOT" && cd "$ROOT" && pwd)  # absolute: PATH below names it
# TORCH_ENDS_TESTS overrides the project's tests run on each end (.ci/run passes a smaller set)
ALL_TESTS="tests/test_trace.py tests/test_tracer_wrappers.py tests/test_functional_trace.py tests/test_side_groups.py"
ALL_TESTS+=" tests/test_watch_hook.py tests/test_spmd.py tests/test_startup.py"
read -r -a SUBSET <<< "${TORCH_ENDS_TESTS:-$ALL_TESTS}"
for version in $ENDS; do
  venv="$ROOT/torch-$version"
  t0=$(date +%s)
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --no-cache-dir "torch==$version" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} \
    2> >(grep -v '^WARNING: Location' >&2)
  # the plugin (never upgrades torch: it does not require it), the tests' own needs, transformers for suites/modern
  "$venv/bin/pip" install -q --no-cache-dir -e . pytest-timeout pytest-xdist expecttest transformers \
    ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} 2> >(grep -v '^WARNING: Location' >&2)
  "$venv/bin/python" -c "import torch; v = torch.__version__.split('+')[0]; assert v == '$version', v; print('torch', torch.__version__)"
  t1=$(date +%s)
  PATH="$venv/bin:$PATH" python -m pytest -q -p no:cacheprovider "${SUBSET[@]}"
  PATH="$venv/bin:$PATH" python -m pytest --nccl-world=2 suites/launch suites/modern -q -p no:cacheprovider -rfEX
  if "$venv/bin/python" -c "import sys, torch; sys.exit(tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]) >= (2, 10))"; then
    # OpenRLHF 0.6.1's own weight-sync group (it runs on torch before 2.10; --no-deps: only its
    # distributed_util.py is loaded), in a test and under the watch (docs/watch.md)
    "$venv/bin/pip" install -q --no-cache-dir --no-deps openrlhf==0.6.1 2> >(grep -v '^WARNING: Location' >&2)
    PATH="$venv/bin:$PATH" python -m pytest -q -p no:cacheprovider -rs tests/test_openrlhf_group.py tests/test_watch_side_group.py
  fi
  echo "CI: torch $version: install $(( t1 - t0 )) s, tests $(( $(date +%s) - t1 )) s"
  rm -rf "$venv"  # ~5 GB each
done
