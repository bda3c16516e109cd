#!/usr/bin/env bash
# Rendezvous benchmarks side by side with torch.distributed.TCPStore (the pinned torch in
# .venv). Usage: bash bench/rdzv_bench.sh [build-dir]   (figures: docs/bench-rendezvous.md)
# Build the benchmarks optimised, as TCPStore is:
#   cmake -S . -B build-rdzv-rel -G Ninja -DDDPL_WITH_TORCH=OFF -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-rdzv-rel -j2 --target rdzv_store_bench rdzv_scale_bench
# Each store configuration runs REPEAT times (default 3), the two sides interleaved, and the
# run with the median throughput is reported for each side: the machine is shared and noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
PY="${DDPL_PYTHON:-.venv/bin/python}"
ROUNDS="${ROUNDS:-200}"
REPEAT="${REPEAT:-3}"
BIN="$BUILD_DIR/bin"
for b in rdzv_store_bench rdzv_scale_bench; do
  [ -x "$BIN/$b" ] || { echo "missing $BIN/$b: build with -DDDPL_BUILD_BENCH=ON" >&2; exit 1; }
done
bt=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null || true)
case "$bt" in
  Release | RelWithDebInfo) ;;
  *) echo "warning: $BUILD_DIR is not an optimised build (CMAKE_BUILD_TYPE='$bt'):" \
       "configure with -DCMAKE_BUILD_TYPE=Release for figures comparable to TCPStore" >&2 ;;
esac

field() { sed -n "s/.*\b$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
# The line with the median ops_per_s among the lines given on stdin.
median() { awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^ops_per_s=/) { split($i, a, "="); print a[2], $0 } }' |
  sort -n | awk '{ l[NR] = $0 } END { s = l[int((NR + 1) / 2)]; sub(/^[^ ]* /, "", s); print s }'; }

echo "== rendezvous scale: N agents join one round (target: 4096 in < 2000 ms)"
"$BIN/rdzv_scale_bench" --agents 64,256,1024,4096 2>/dev/null

echo "== store: NCCL-bootstrap pattern (set, add, get, wait), $ROUNDS rounds, median of $REPEAT"
printf '%-8s %12s %12s %8s %10s %10s %10s %10s\n' clients grpc_ops/s tcpstore_ops/s ratio \
  grpc_p50us tcp_p50us grpc_p99us tcp_p99us
for c in 1 16 64; do
  gs="" ts=""
  for _ in $(seq "$REPEAT"); do
    gs+=$("$BIN/rdzv_store_bench" --clients "$c" --rounds "$ROUNDS" 2>/dev/null)$'\n'
    ts+=$("$PY" bench/rdzv_tcpstore_bench.py --clients "$c" --rounds "$ROUNDS" 2>/dev/null |
      grep impl=)$'\n'
  done
  g=$(median <<<"$gs"); t=$(median <<<"$ts")
  gt=$(field ops_per_s "$g"); tt=$(field ops_per_s "$t")
  printf '%-8s %12s %12s %8s %10s %10s %10s %10s\n' "$c" "$gt" "$tt" \
    "$(awk -v a="$gt" -v b="$tt" 'BEGIN { printf "%.2f", a / b }')" \
    "$(field p50_us "$g")" "$(field p50_us "$t")" "$(field p99_us "$g")" "$(field p99_us "$t")"
done
