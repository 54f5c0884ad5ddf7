#!/usr/bin/env bash
# The project's checks on a GPU host, in one go, in 8-9 minutes at most on a 16-core one-GPU host:
#   1. tests/gpu, alone on the GPU;
#   2. the project's own tests under xdist (CUDA visible), beside the suites at world 2 (gloo
#      fallback with CUDA visible) and, without xdist, the tests that place ranks and start groups;
#   3. cold start: one world-4 test as a whole process against `python -c "import torch, pytest"`.
# Every pytest runs with -v, so a line per test is written as each finishes, and with the plugin
# tests/gpu/live_log.py, which appends each failure's report to failures.log as it happens: a run
# cut off by its time limit still says what failed and why. Each phase has its own time limit; the
# summary at the end lists every failed test and each phase's exit status.
#
# Use: bash tests/gpu/run_gpu_host.sh [RESULTS_DIR]   (default: $OUT, else ./gpu-host-results)
# Environment: PY (the python with torch; default python3), XDIST (workers; default 12).
set -uo pipefail
cd "$(dirname "$0")/../.."
RESULTS=${1:-${OUT:-gpu-host-results}}
PY=${PY:-python3}
XDIST=${XDIST:-12}
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
export PYTHONUNBUFFERED=1 PYTEST_ADDOPTS="" PYTEST_LIVE_LOG="$RESULTS/failures.log"
export PYTHONPATH="$PWD/tests/gpu${PYTHONPATH:+:$PYTHONPATH}"  # live_log.py
SUMMARY="$RESULTS/summary.txt"
t0=$(date +%s)
say() { printf '[%4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*" | tee -a "$SUMMARY"; }

# pytest ... under a time limit, its output (a line per test) into LOG; the exit status is said.
phase() {
  local name=$1 limit=$2 log=$3; shift 3
  say "$name: start (limit ${limit}s)"
  timeout -k 10 "$limit" "$PY" -m pytest -p no:cacheprovider -p live_log -v "$@" >"$log" 2>&1
  local rc=$?
  say "$name: exit $rc$( [ $rc -eq 124 ] && echo ' (cut off at its limit)')  $(grep -E '^=+ .*(passed|failed|error).* =+$' "$log" | tail -1)"
}

{
  say "host: $(nproc) cores; $("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1 | tail -1)"
  command -v nvidia-smi >/dev/null && say "gpu: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -4 | tr '\n' ';')"
  say "nccl: $("$PY" -c 'import torch; print(torch.cuda.nccl.version())' 2>&1 | tail -1)"
} 

# with the watch over real NCCL jobs (tests/test_watch_nccl_model.py: on a GPU its one-rank job runs on NCCL)
phase "tests/gpu" 220 "$RESULTS/gpu.log" tests/gpu tests/test_watch_nccl_model.py -rfEP --durations=8  # -rP: what the NCCL checks measured

# The rest together: xdist workers, the suites and the serial tests share the host's cores.
phase "project tests -n $XDIST" 240 "$RESULTS/tests_xdist.log" tests -n "$XDIST" --ignore=tests/gpu -rfE --durations=15 &
xdist=$!
phase "suites world 2" 260 "$RESULTS/suites.log" --nccl-world=2 suites -rfEX &
suites=$!
phase "project tests without xdist (placement, group start, failures)" 260 "$RESULTS/tests_serial.log" \
  tests/test_placement.py tests/test_placement_rules.py tests/test_lifecycle.py tests/test_failures.py -rfE &
serial=$!
wait $xdist $suites $serial

say "cold start: one world-4 test, whole processes, 2 rounds (floor, pytest floor, ours)"
cold=$(mktemp -d)
cat >"$cold/test_one.py" <<'EOF'
import pytest, torch
import torch.distributed as dist

@pytest.mark.nccl(world=4)
def test_one(rank):
    dist.all_reduce(torch.ones(1))
EOF
cat >"$cold/test_plain.py" <<'EOF'
import torch

def test_plain():
    assert torch.ones(1).item() == 1
EOF
seconds() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); awk "BEGIN{printf \"%.2f\", $e - $s}"; }
for i in 1 2; do
  a=$(seconds "$PY" -c "import torch, pytest")
  p=$(seconds "$PY" -m pytest -q -p no:cacheprovider "$cold/test_plain.py")
  b=$(seconds "$PY" -m pytest -q -p no:cacheprovider "$cold/test_one.py")
  say "round $i: import torch, pytest ${a}s  pytest, one plain torch test ${p}s  ours, one world-4 test ${b}s"
done
# where the controller's time goes: its imports and its calls (cProfile of the whole session)
"$PY" -X importtime -m pytest -q -p no:cacheprovider "$cold/test_one.py" 2>"$cold/imports.txt" >/dev/null
"$PY" -m cProfile -o "$cold/session.prof" -m pytest -q -p no:cacheprovider "$cold/test_one.py" >/dev/null 2>&1
{
  echo "== slowest imports (cumulative us) =="
  sort -t'|' -k2 -n -r "$cold/imports.txt" | head -25
  echo "== the session's calls by cumulative time =="
  "$PY" -c "import pstats; pstats.Stats('$cold/session.prof').sort_stats('cumulative').print_stats(45)" 2>&1 | tail -60
  echo "== pytest_nccl's own calls =="
  "$PY" -c "import pstats; pstats.Stats('$cold/session.prof').sort_stats('cumulative').print_stats('pytest_nccl', 30)" 2>&1 | tail -40
} >"$RESULTS/cold.txt"
rm -rf "$cold"

say "failed or errored tests:"
grep -hE '(FAILED|ERROR) ' "$RESULTS"/*.log | grep -E '::' | sed -E 's/^\[gw[0-9]+\] //' | sort -u | tee -a "$SUMMARY"
say "done"
