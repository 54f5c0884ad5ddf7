# Shared by .ci/trl_stacks.sh and .ci/verl_stacks.sh (sourced, never run): a release "stack" is a
# venv of pinned packages over the CPU torch, cached by a stamp of its pins; its suite's JUnit file is
# checked against the documented outcome of every test (.ci/check_stack_outcomes.py); one summary.
#
# The sourcing script sets, before sourcing:
#   STACKS_NAME   the prefix of log lines and of the closing line ("trl-stacks")
#   ENV_PREFIX    its environment variables' prefix ("TRL_STACKS": TRL_STACKS_OUT, _PYTHON, _TORCH,
#                 _RUN_TIMEOUT)
#   PINS          an associative array, stack -> pins
#   IMPORTS       the modules a built stack must import ("trl, transformers, accelerate, datasets, torch")
#   RUN_TIMEOUT_DEFAULT  (optional) seconds a suite's run may take, 900 unless set
# and gets REPO, CACHE, OUT, PYTHON, TORCH_PIN, RUN_TIMEOUT, log, build_stack, check_stack and
# finish. Venvs live in ${PYTEST_NCCL_CACHE:-$HOME/.cache/pytest-nccl}/stacks/<stack>.

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PYTEST_NCCL_CACHE:-$HOME/.cache/pytest-nccl}/stacks
_var() { local name="${ENV_PREFIX}_$1"; echo "${!name:-$2}"; }
OUT=$(_var OUT "${TMPDIR:-/tmp}/pytest-nccl-${STACKS_NAME}")
PYTHON=$(_var PYTHON python3.11)
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
TORCH_PIN=$(_var TORCH torch==2.13.0)
RUN_TIMEOUT=$(_var RUN_TIMEOUT "${RUN_TIMEOUT_DEFAULT:-900}")
mkdir -p "$OUT" "$CACHE"

log() { printf '[%s %s] %s\n' "$STACKS_NAME" "$(date +%H:%M:%S)" "$*"; }
_quiet_pip() { "$@" 2>&1 | grep -v '^WARNING: Location' >&2; }

# _seed_for NAME -> echoes a built stack whose pins are NAME's but for its first package's version
# (trl-0.15.1 for trl-0.15.0, verl-0.7.1 for verl-0.7.0): NAME starts as a copy of it and pip changes
# that one package, seconds instead of minutes of installing the same dependencies again
_seed_for() {
  local name=$1 other rest=${PINS[$1]#* }
  [[ ${PINS[$1]} == *" "* ]] || return 1
  for other in "${!PINS[@]}"; do
    if [[ $other != "$name" && ${PINS[$other]} == *" "* && ${PINS[$other]#* } == "$rest" && -x $CACHE/$other/bin/python \
          && "$(cat "$CACHE/$other/.stack-stamp" 2>/dev/null)" == "$TORCH_PIN ${PINS[$other]} pytest" ]]; then
      echo "$CACHE/$other"; return 0
    fi
  done
  return 1
}

# _copy_venv FROM TO: a venv copied whole, its scripts' and activation files' paths made TO's (its
# python finds its packages from where it is run: pyvenv.cfg beside bin/)
_copy_venv() {
  local from=$1 to=$2
  cp -a "$from" "$to" || return 1
  rm -f "$to/.stack-stamp"
  { grep -rlI --null "$from" "$to/bin" || true; } | xargs -0 -r sed -i "s|$from|$to|g"  # none: nothing to change
}

# build_stack NAME -> echoes the venv's python; cached by a stamp of the pins
build_stack() {
  local name=$1 pins=${PINS[$1]:-} venv=$CACHE/$1
  local stamp="$TORCH_PIN $pins pytest"
  if [[ -x $venv/bin/python && -f $venv/.stack-stamp && "$(cat "$venv/.stack-stamp")" == "$stamp" ]]; then
    log "$name: cached venv $venv" >&2
  else
    rm -rf "$venv"
    local seed
    if seed=$(_seed_for "$name"); then
      log "$name: building $venv ($pins) from a copy of $seed" >&2
      _copy_venv "$seed" "$venv" || return 1
    else
      log "$name: building $venv ($pins)" >&2
      "$PYTHON" -m venv "$venv" || return 1
      _quiet_pip "$venv/bin/python" -m pip install -q "$TORCH_PIN" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    fi
    # never a CUDA build: that is a multi-GB download and not what these stacks test
    "$venv/bin/python" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)' \
      || { log "$name: torch is not the CPU build; refusing" >&2; return 1; }
    # shellcheck disable=SC2086
    _quiet_pip "$venv/bin/python" -m pip install -q $pins pytest "$TORCH_PIN" \
      ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"}
    "$venv/bin/python" -c "import $IMPORTS" >&2 || return 1
    echo "$stamp" > "$venv/.stack-stamp"
  fi
  # the plugin itself, editable, no deps: always this checkout
  _quiet_pip "$venv/bin/python" -m pip install -q --no-deps -e "$REPO" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"}
  echo "$venv/bin/python"
}

status=0
summary=()

# check_stack NAME PYTHON SECONDS_BUILT PYTEST_ARGS...: the suite under the stack's python, each
# test's outcome checked against the documented one; a line in the summary
check_stack() {
  local name=$1 py=$2 build=$3
  shift 3
  local xml=$OUT/$name.xml start rc ran
  start=$(date +%s)
  rm -f "$xml"
  (cd "$REPO" && timeout "$RUN_TIMEOUT" "$py" -m pytest "$@" -p no:cacheprovider -o addopts="" -q -rfEs \
      --junitxml="$xml") > "$OUT/$name.log" 2>&1
  rc=$?
  ran=$(( $(date +%s) - start ))
  # pytest's own closing line stays in the log: on the bad stacks it counts expected failures
  log "$name: pytest exited $rc; checking each test's outcome ($OUT/$name.log)"
  if [[ $rc -ne 0 && $rc -ne 1 ]] || [[ ! -s $xml ]]; then
    status=1; summary+=("$name: pytest rc=$rc (log $OUT/$name.log)"); return
  fi
  if python3 "$REPO/.ci/check_stack_outcomes.py" "$name" "$xml"; then
    summary+=("$name: as documented (build $build s, tests $ran s)")
  else
    status=1; summary+=("$name: UNEXPECTED (see above; log $OUT/$name.log)")
  fi
}

# stack_python NAME -> echoes the stack's python, built or cached; fails with a summary word
stack_python() {
  local name=$1
  [[ -n ${PINS[$name]:-} ]] || { log "$name: unknown stack (see --list)" >&2; echo "unknown stack"; return 1; }
  build_stack "$name" || { log "$name: build failed" >&2; echo "build failed"; return 1; }
}

# finish: the summary; one plain closing line (a stack "passed" when every test had its documented
# outcome) and the exit status
finish() {
  local n_ok=0 n_bad=0 line
  log "summary:"
  for line in "${summary[@]}"; do
    echo "  $line"
    if [[ $line == *": as documented"* ]]; then n_ok=$((n_ok + 1)); else n_bad=$((n_bad + 1)); fi
  done
  echo "$STACKS_NAME: $n_ok passed, $n_bad failed"
  exit $status
}
