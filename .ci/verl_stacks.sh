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

STACKS_NAME=verl-stacks ENV_PREFIX=VERL_STACKS IMPORTS="verl, transformers, torch" RUN_TIMEOUT_DEFAULT=600

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

# shellcheck source=.ci/stacks_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/stacks_lib.sh"

for name in $STACKS; do
  start=$(date +%s)
  py=$(stack_python "$name") || { status=1; summary+=("$name: $py"); continue; }
  log "$name: $("$py" -c 'import verl, transformers, torch; print(f"verl {verl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")' 2>/dev/null)"
  check_stack "$name" "$py" $(( $(date +%s) - start )) --nccl-world=2 suites/verl tests/test_watch_verl.py
done

finish
