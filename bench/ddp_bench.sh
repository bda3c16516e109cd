#!/usr/bin/env bash
# Our C++ DDP vs PyTorch's Python DDP (same small ResNet, same per-rank batch, 2 ranks, Gloo on
# CPU), interleaved round by round so that machine noise hits all variants alike; plus our DDP
# with communication switched off, to show the overhead. Prints medians and ratios.
# Usage: bench/ddp_bench.sh [BUILD_DIR] [ROUNDS]   (STEPS=N timed steps per run, default 60)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
ROUNDS=${2:-7}
NPROC=${NPROC:-2}
STEPS=${STEPS:-60}
PY=${DDPL_PYTHON:-$ROOT/.venv/bin/python}
TORCHRUN=$(dirname "$PY")/torchrun
BIN=$BUILD/bench/ddp_bench
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [[ -x $BUILD/bin/launch ]]; then
  CPP_LAUNCH=("$BUILD/bin/launch" --standalone --nproc-per-node="$NPROC")
  CPP_LAUNCHER=launch
else
  CPP_LAUNCH=("$TORCHRUN" --standalone --nproc-per-node="$NPROC" --no-python)
  CPP_LAUNCHER="torchrun --no-python (launch not built)"
fi
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
# Runs one variant; prints rank 0's samples/s, or stops the benchmark showing why the run failed.
rate() {
  local what=$1 x
  shift
  "$@" >"$LOG" 2>&1 || true
  x=$(grep -o 'samples_per_sec=[0-9.]*' "$LOG" | tail -1 | cut -d= -f2)
  if [[ -z $x ]]; then
    echo "ddp_bench.sh: the $what run printed no samples_per_sec; its last lines:" >&2
    tail -20 "$LOG" >&2
    exit 1
  fi
  echo "$x"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
py=(); cpp=(); nocomm=()
for ((r = 1; r <= ROUNDS; r++)); do
  py+=("$(rate "Python DDP" "$TORCHRUN" --standalone --nproc-per-node="$NPROC" "$ROOT/bench/ddp_bench.py" --steps="$STEPS")")
  cpp+=("$(rate "C++ DDP" env DDPL_BACKEND=gloo "${CPP_LAUNCH[@]}" "$BIN" --steps="$STEPS")")
  nocomm+=("$(rate "C++ no-comm" env DDPL_BACKEND=gloo "${CPP_LAUNCH[@]}" "$BIN" --steps="$STEPS" --no-comm)")
  echo "round $r: python ${py[-1]}  cpp ${cpp[-1]}  cpp-no-comm ${nocomm[-1]} samples/s"
done
P=$(printf '%s\n' "${py[@]}" | median)
C=$(printf '%s\n' "${cpp[@]}" | median)
N=$(printf '%s\n' "${nocomm[@]}" | median)
echo "median samples/s: python DDP (torchrun) $P | C++ DDP ($CPP_LAUNCHER) $C | C++ no-comm $N"
# The same ratios taken round by round (the variants of one round ran back to back, so a slow
# spell of the machine hits them alike), then their median: the steadier figure on a noisy host.
RC=$(for ((i = 0; i < ROUNDS; i++)); do awk -v a="${cpp[i]}" -v b="${py[i]}" 'BEGIN { print a / b }'; done | median)
RN=$(for ((i = 0; i < ROUNDS; i++)); do awk -v a="${cpp[i]}" -v b="${nocomm[i]}" 'BEGIN { print a / b }'; done | median)
awk -v c="$RC" -v n="$RN" 'BEGIN {
  printf "per-round medians: C++ DDP / Python DDP = %.2fx, communication overhead = %.1f%%\n", c, 100 * (1 - n) }'
awk -v c="$C" -v p="$P" -v n="$N" 'BEGIN {
  printf "C++ DDP / Python DDP = %.2fx (target >= 1.1x)\n", c / p;
  printf "communication overhead = %.1f%% (1 - cpp/no-comm; target < 10%%)\n", 100 * (1 - c / n) }'
