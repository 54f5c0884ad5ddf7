#!/usr/bin/env bash
# Prove suites/verl on real verl releases, as .ci/trl_stacks.sh does for TRL: each stack gets its
# own venv (cached), runs `pytest --nccl-world=2 suites/verl` and verl's own Ray worker group under
# the watch (tests/test_watch_verl.py), and .ci/check_stack_outcomes.py asserts each test's
# documented outcome (0.7.1: CollectiveMismatch in verl's dp_actor.py, the watch's verdict there;
# 0.7.0: every test passes; 0.9.1: the legacy-actor tests skip, since 0.8.0 removed that actor).
#
#   .ci/verl_stacks.sh                # the default stacks (VERL_STACKS overrides: "verl-0.7.1")
#   .ci/verl_stacks.sh verl-0.7.1     # just these
#   .ci/verl_stacks.sh --list
#
# Venvs live in ${PYTEST_NCCL_CACHE:-$HOME/.cache/pytest-nccl}/stacks/<stack>, rebuilt when the pins
# change; torch is the CPU build (`torch==2.13.0`, or from $TORCH_INDEX_URL). Logs and JUnit files go
# to ${VERL_STACKS_OUT:-${TMPDIR:-/tmp}/pytest-nccl-verl-stacks}. Exit 1 on any undocumented outcome.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PYTEST_NCCL_CACHE:-$HOME/.cache/pytest-nccl}/stacks
OUT=${VERL_STACKS_OUT:-${TMPDIR:-/tmp}/pytest-nccl-verl-stacks}
PYTHON=${VERL_STACKS_PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
TORCH_PIN=${VERL_STACKS_TORCH:-torch==2.13.0}
RUN_TIMEOUT=${VERL_STACKS_RUN_TIMEOUT:-600}

# verl 0.7.x imports AutoModelForVision2Seq, which transformers 5 removed: pinned below 5. It also
# pins numpy<2, and pyarrow 26 refuses to import with NumPy 1 ("pyarrow requires NumPy 2.0 or
# newer"; 22-25 import with 1.26, checked): Ray's serializer imports pyarrow, so verl's own Ray
# worker group (tests/test_watch_verl.py) fails at its first placement group without the pin
declare -A PINS=(
  [verl-0.7.0]="verl==0.7.0 transformers<5 pyarrow<26"
  [verl-0.7.1]="verl==0.7.1 transformers<5 pyarrow<26"
  [verl-0.9.1]="verl==0.9.1"
)
ORDER=(verl-0.7.0 verl-0.7.1 verl-0.9.1)

if [[ "${1:-}" == "--list" ]]; then
  for s in "${ORDER[@]}"; do printf '%-12s %s\n' "$s" "${PINS[$s]}"; done
  exit 0
fi
if [[ $# -gt 0 ]]; then STACKS="$*"; else STACKS=${VERL_STACKS:-${ORDER[*]}}; fi

mkdir -p "$OUT" "$CACHE"
log() { printf '[verl-stacks %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
quiet() { grep -v '^WARNING: Location' >&2; }

build_stack() {  # NAME -> echoes the venv's python; cached by a stamp of the pins
  local name=$1 pins=${PINS[$1]} venv=$CACHE/$1
  local stamp="$TORCH_PIN $pins pytest"
  if [[ -x $venv/bin/python && -f $venv/.stack-stamp && "$(cat "$venv/.stack-stamp")" == "$stamp" ]]; then
    log "$name: cached venv $venv" >&2
  else
    log "$name: building $venv ($pins)" >&2
    rm -rf "$venv"
    "$PYTHON" -m venv "$venv" || return 1
    "$venv/bin/python" -m pip install -q "$TORCH_PIN" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} 2>&1 | quiet
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
      || { log "$name: torch is not the CPU build; refusing" >&2; return 1; }
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install -q $pins pytest "$TORCH_PIN" \
      ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} 2>&1 | quiet
    "$venv/bin/python" -c 'import verl, transformers, torch' >&2 || return 1
    echo "$stamp" > "$venv/.stack-stamp"
  fi
  "$venv/bin/python" -m pip install -q --no-deps -e "$REPO" 2>&1 | quiet
  echo "$venv/bin/python"
}

status=0
summary=()
for name in $STACKS; do
  [[ -n ${PINS[$name]:-} ]] || { log "$name: unknown stack (see --list)"; status=1; summary+=("$name: unknown"); continue; }
  start=$(date +%s)
  py=$(build_stack "$name") || { log "$name: build failed"; status=1; summary+=("$name: build failed"); continue; }
  built=$(date +%s)
  log "$name: $("$py" -c 'import verl, transformers, torch; print(f"verl {verl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")' 2>/dev/null)"
  xml=$OUT/$name.xml
  rm -f "$xml"
  (cd "$REPO" && timeout "$RUN_TIMEOUT" "$py" -m pytest --nccl-world=2 suites/verl tests/test_watch_verl.py -p no:cacheprovider \
      -o addopts="" -q -rfEs --junitxml="$xml") > "$OUT/$name.log" 2>&1
  rc=$?
  ran=$(( $(date +%s) - built ))
  if [[ $rc -ne 0 && $rc -ne 1 ]] || [[ ! -s $xml ]]; then
    log "$name: pytest exited $rc (log: $OUT/$name.log)"; status=1; summary+=("$name: pytest rc=$rc"); continue
  fi
  if python3 "$REPO/.ci/check_stack_outcomes.py" "$name" "$xml"; then
    summary+=("$name: as documented (build $((built - start)) s, tests $ran s)")
  else
    status=1; summary+=("$name: UNEXPECTED (log $OUT/$name.log)")
  fi
done

log "summary:"
n_ok=0; n_bad=0
for line in "${summary[@]}"; do
  echo "  $line"
  if [[ $line == *": as documented"* ]]; then n_ok=$((n_ok + 1)); else n_bad=$((n_bad + 1)); fi
done
echo "verl-stacks: $n_ok passed, $n_bad failed"
exit $status
