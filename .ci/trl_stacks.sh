#!/usr/bin/env bash
# Prove suites/trl on real TRL releases: each known-bad / known-good stack gets its own venv
# (cached), runs `pytest --nccl-world=2 suites/trl`, and .ci/check_stack_outcomes.py asserts the
# documented outcome of every test (which fail with CollectiveMismatch, which pass).
#
#   .ci/trl_stacks.sh                 # the default stacks (TRL_STACKS overrides: "trl-0.15.0 current")
#   .ci/trl_stacks.sh trl-0.15.0      # just these
#   .ci/trl_stacks.sh --list          # print the known stacks and their pins
#
# Venvs live in ${PYTEST_NCCL_CACHE:-$HOME/.cache/pytest-nccl}/stacks/<stack>, rebuilt when the
# pins change. torch comes from `pip install torch==2.13.0` (the CPU wheel on this machine's disk,
# or from $TORCH_INDEX_URL, PyTorch's CPU wheel index, passed to every install; the script refuses a
# CUDA build). "current" means the project's own .venv (a current release).
# JUnit files and logs go to ${TRL_STACKS_OUT:-${TMPDIR:-/tmp}/pytest-nccl-trl-stacks}. Exit 1 if any stack
# had an undocumented outcome or could not be built.
set -uo pipefail

STACKS_NAME=trl-stacks ENV_PREFIX=TRL_STACKS IMPORTS="trl, transformers, accelerate, datasets, torch"

# stack -> pins (transformers/accelerate/datasets chosen to install and run with torch 2.13 CPU, py3.11)
declare -A PINS=(
  [trl-0.14.0]="trl==0.14.0 transformers==4.48.3 accelerate==1.3.0 datasets==3.2.0"
  [trl-0.15.0]="trl==0.15.0 transformers==4.49.0 accelerate==1.4.0 datasets==3.3.2"
  [trl-0.15.1]="trl==0.15.1 transformers==4.49.0 accelerate==1.4.0 datasets==3.3.2"
  [trl-0.16.1]="trl==0.16.1 transformers==4.51.0 accelerate==1.6.0 datasets==3.5.0"
  [trl-0.17.0]="trl==0.17.0 transformers==4.51.3 accelerate==1.6.0 datasets==3.5.0"
  [trl-0.23.0]="trl==0.23.0 transformers==4.56.2 accelerate==1.10.1 datasets==4.1.1"
  [trl-0.23.1]="trl==0.23.1 transformers==4.56.2 accelerate==1.10.1 datasets==4.1.1"
)
ORDER=(trl-0.14.0 trl-0.15.0 trl-0.15.1 trl-0.16.1 trl-0.17.0 trl-0.23.0 trl-0.23.1)
DEFAULT="${ORDER[*]} current"

if [[ "${1:-}" == "--list" ]]; then
  for s in "${ORDER[@]}"; do printf '%-12s %s\n' "$s" "${PINS[$s]}"; done
  printf '%-12s %s\n' current "the project's .venv"
  exit 0
fi
if [[ $# -gt 0 ]]; then STACKS="$*"; else STACKS=${TRL_STACKS:-$DEFAULT}; fi

# shellcheck source=.ci/stacks_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/stacks_lib.sh"

for name in $STACKS; do
  start=$(date +%s)
  if [[ $name == current ]]; then
    py=$REPO/.venv/bin/python
    [[ -x $py ]] || { log "current: no $py"; status=1; summary+=("current: no .venv"); continue; }
  else
    py=$(stack_python "$name") || { status=1; summary+=("$name: $py"); continue; }
  fi
  log "$name: $("$py" -c 'import trl, transformers, accelerate, datasets, torch; print(f"trl {trl.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}, datasets {datasets.__version__}, torch {torch.__version__}")' 2>/dev/null)"
  # the named regression tests; the generated matrix (suites/trl/matrix) has its own release
  # runs (`python -m pytest_nccl matrix`, suites/trl/MATRIX.md) and runs in CI on the current stack
  check_stack "$name" "$py" $(( $(date +%s) - start )) --nccl-world=2 suites/trl --ignore=suites/trl/matrix --durations=0
done

# -- pytest-nccl watch on TRL's own SFT script (tests/test_watch_trl.py): the verdict on the
# documented bad release (the trl-0.15.0 stack built above), the job untouched on the current one.
# A block of its own: it runs only when trl-0.15.0 was among the stacks and the project's .venv exists.
if [[ " $STACKS " == *" trl-0.15.0 "* && -x $CACHE/trl-0.15.0/bin/python && -x $REPO/.venv/bin/python ]]; then
  log "watch: TRL's SFT script under pytest-nccl watch, trl-0.15.0 and current ($OUT/watch-trl.log)"
  (cd "$REPO" && PYTEST_NCCL_CACHE="${PYTEST_NCCL_CACHE:-$HOME/.cache/pytest-nccl}" timeout "$RUN_TIMEOUT" \
      "$REPO/.venv/bin/python" -m pytest tests/test_watch_trl.py -p no:cacheprovider -o addopts="" -q -rs) \
      > "$OUT/watch-trl.log" 2>&1
  rc=$?
  # both tests must pass: a skip means the stack was not found, which is a failure here
  if [[ $rc -eq 0 ]] && grep -q "2 passed" "$OUT/watch-trl.log" && ! grep -q "skipped" "$OUT/watch-trl.log"; then
    summary+=("watch on trl-0.15.0 SFT: as documented (verdict, exit 3; current release untouched)")
  else
    status=1; summary+=("watch on trl-0.15.0 SFT: UNEXPECTED (pytest rc=$rc; log $OUT/watch-trl.log)")
  fi
fi

finish
