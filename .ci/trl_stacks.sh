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

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PYTEST_NCCL_CACHE:-$HOME/.cache/pytest-nccl}/stacks
OUT=${TRL_STACKS_OUT:-${TMPDIR:-/tmp}/pytest-nccl-trl-stacks}
PYTHON=${TRL_STACKS_PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
TORCH_PIN=${TRL_STACKS_TORCH:-torch==2.13.0}
RUN_TIMEOUT=${TRL_STACKS_RUN_TIMEOUT:-900}

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

mkdir -p "$OUT" "$CACHE"
log() { printf '[trl-stacks %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# build_stack NAME -> echoes the venv's python; cached by a stamp of the pins
build_stack() {
  local name=$1 pins=${PINS[$1]:-} venv=$CACHE/$1
  local stamp="$TORCH_PIN $pins pytest"
  if [[ -x $venv/bin/python && -f $venv/.stack-stamp && "$(cat "$venv/.stack-stamp")" == "$stamp" ]]; then
    log "$name: cached venv $venv" >&2
  else
    log "$name: building $venv ($pins)" >&2
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv" || return 1
    "$venv/bin/python" -m pip install -q "$TORCH_PIN" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} 2>&1 \
      | grep -v '^WARNING: Location' >&2
    # never a CUDA build: that is a multi-GB download and not what these stacks test
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
      || { log "$name: torch is not the CPU build; refusing" >&2; return 1; }
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q $pins pytest "$TORCH_PIN" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
      2>&1 | grep -v '^WARNING: Location' >&2
    "$venv/bin/python" -c 'import trl, transformers, accelerate, datasets, torch' >&2 || return 1
    echo "$stamp" > "$venv/.stack-stamp"
  fi
  # the plugin itself, editable, no deps: always this checkout
  "$venv/bin/python" -m pip install -q --no-deps -e "$REPO" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} 2>&1 \
    | grep -v '^WARNING: Location' >&2
  echo "$venv/bin/python"
}

status=0
summary=()
n_ok=0
n_bad=0
for name in $STACKS; do
  start=$(date +%s)
  if [[ $name == current ]]; then
    py=$REPO/.venv/bin/python
    [[ -x $py ]] || { log "current: no $py"; status=1; summary+=("current: no .venv"); continue; }
  elif [[ -z ${PINS[$name]:-} ]]; then
    log "$name: unknown stack (see --list)"; status=1; summary+=("$name: unknown"); continue
  else
    py=$(build_stack "$name") || { log "$name: build failed"; status=1; summary+=("$name: build failed"); continue; }
  fi
  built=$(date +%s)
  versions=$("$py" -c 'import trl, transformers, accelerate, datasets, torch; print(f"trl {trl.__version__}, transformers {transformers.__version__}, accelerate {accelerate.__version__}, datasets {datasets.__version__}, torch {torch.__version__}")' 2>/dev/null)
  log "$name: $versions"
  xml=$OUT/$name.xml
  rm -f "$xml"
  # the named regression tests; the generated matrix (suites/trl/matrix) has its own release
  # runs (`python -m pytest_nccl matrix`, suites/trl/MATRIX.md) and runs in CI on the current stack
  (cd "$REPO" && timeout "$RUN_TIMEOUT" "$py" -m pytest --nccl-world=2 suites/trl --ignore=suites/trl/matrix -p no:cacheprovider \
      -o addopts="" -q -rfE --durations=0 --junitxml="$xml") > "$OUT/$name.log" 2>&1
  rc=$?
  # pytest's own closing line stays in the log: on the bad stacks it counts expected failures
  log "$name: pytest exited $rc; checking each test's outcome ($OUT/$name.log)"
  ran=$(( $(date +%s) - built ))
  if [[ $rc -ne 0 && $rc -ne 1 ]] || [[ ! -s $xml ]]; then
    log "$name: pytest exited $rc (log: $OUT/$name.log)"
    status=1; summary+=("$name: pytest rc=$rc"); continue
  fi
  if python3 "$REPO/.ci/check_stack_outcomes.py" "$name" "$xml"; then
    summary+=("$name: as documented (build $((built - start)) s, tests $ran s)")
  else
    status=1; summary+=("$name: UNEXPECTED (see above; log $OUT/$name.log)")
  fi
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

log "summary:"
for line in "${summary[@]}"; do
  echo "  $line"
  if [[ $line == *": as documented"* ]]; then n_ok=$((n_ok + 1)); else n_bad=$((n_bad + 1)); fi
done
# one plain closing line: a stack "passed" when every test had its documented outcome
echo "trl-stacks: $n_ok passed, $n_bad failed"
exit $status
