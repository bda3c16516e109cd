#!/usr/bin/env bash
# Every benchmark, each side by side with its reference. Figures go to docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
PY=.venv/bin/python
echo "== launch overhead"; $PY bench/launch_overhead.py --build "$BUILD_DIR" --rounds 30
echo "== recovery after a node loss"; $PY bench/recovery_bench.py --build "$BUILD_DIR" --rounds 3
echo "== hang detection"; $PY bench/hang_detect.py --build "$BUILD_DIR" --rounds 5 --hang-timeout 5 --cap 180
echo "== agent store vs torch's TCPStore server"; $PY bench/agent_store_bench.py --build "$BUILD_DIR"
echo "== warm restarts: time to resume, first start, goodput under failures (vs torchrun)"
$PY bench/warm_restart_bench.py --build "$BUILD_DIR" --rounds 3 --ranks 2 4
echo "== checkpoints in memory vs torch.save and DCP to disk"
$PY bench/checkpoint_bench.py --launch "$BUILD_DIR/bin/launch"
for extra in bench/rdzv_bench.sh bench/ddp_bench.sh; do
  if [ -f "$extra" ]; then echo "== $extra"; bash "$extra" "$BUILD_DIR"; fi
done
if [ -x "$BUILD_DIR/bench/error_trace_bench" ]; then
  echo "== error-file symbolisation"; "$BUILD_DIR/bench/error_trace_bench" --rounds 10
fi
