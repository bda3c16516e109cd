#!/usr/bin/env bash
# NCCL checks for the worker library, for a machine with a GPU (never part of the normal suite):
# builds ddpl_worker and worker_rank, then runs the DDP equivalence and overlap scenarios over
# NCCL on one GPU (a single-rank group: NCCL refuses two ranks on one GPU) and over as many
# ranks as there are GPUs when there are two or more.
# Usage: tests/gpu/worker_nccl_check.sh [BUILD_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
PY=${DDPL_PYTHON:-$ROOT/.venv/bin/python}
PREFIX=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [[ "$GPUS" -lt 1 ]]; then echo "no GPU visible: nothing to check"; exit 0; fi
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$PREFIX" \
  -DDDPL_PYTHON="$PY" -DDDPL_BUILD_BENCH=OFF >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target worker_rank
RANK_BIN=$BUILD/tests/worker_rank
TORCHRUN=$(dirname "$PY")/torchrun
run() {  # run NPROC SCENARIO
  echo "== NCCL, $1 rank(s): $2"
  DDPL_BACKEND=nccl timeout 300 "$TORCHRUN" --standalone --nproc-per-node="$1" --no-python "$RANK_BIN" "$2"
}
for scenario in equivalence equivalence_nosync equivalence_batchnorm overlap; do
  [[ $scenario == overlap ]] || run 1 "$scenario"
  [[ "$GPUS" -ge 2 ]] && run 2 "$scenario"
done
echo "NCCL checks passed on $GPUS GPU(s)"
