#!/usr/bin/env bash
# Rendezvous benchmarks side by side with torch.distributed.TCPStore (the pinned torch in
# .venv). Usage: bash bench/rdzv_bench.sh [build-dir]   (figures: docs/bench-rendezvous.md)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
PY="${DDPL_PYTHON:-.venv/bin/python}"
ROUNDS="${ROUNDS:-200}"
BIN="$BUILD_DIR/bin"
for b in rdzv_store_bench rdzv_scale_bench; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: build with -DDDPL_BUILD_BENCH=ON" >&2; exit 1; }
done

field() { sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" <<<"$2"; }

echo "== rendezvous scale: N agents join one round (target: 4096 in < 2000 ms)"
"$BIN/rdzv_scale_bench" --agents 64,256,1024,4096 2>/dev/null

echo "== store: NCCL-bootstrap pattern (set, add, get, wait), $ROUNDS rounds"
printf '%-8s %12s %12s %8s %10s %10s %10s %10s\n' clients grpc_ops/s tcpstore_ops/s ratio \
  grpc_p50us tcp_p50us grpc_p99us tcp_p99us
for c in 1 16 64; do
  g=$("$BIN/rdzv_store_bench" --clients "$c" --rounds "$ROUNDS" 2>/dev/null)
  t=$("$PY" bench/rdzv_tcpstore_bench.py --clients "$c" --rounds "$ROUNDS" 2>/dev/null | grep impl=)
  gt=$(field ops_per_s "$g"); tt=$(field ops_per_s "$t")
  printf '%-8s %12s %12s %8s %10s %10s %10s %10s\n' "$c" "$gt" "$tt" \
    "$(awk -v a="$gt" -v b="$tt" 'BEGIN { printf "%.2f", a / b }')" \
    "$(field p50_us "$g")" "$(field p50_us "$t")" "$(field p99_us "$g")" "$(field p99_us "$t")"
done
