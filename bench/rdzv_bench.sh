#!/usr/bin/env bash
# Rendezvous benchmarks side by side with torch.distributed.TCPStore (the pinned torch in
# .venv). Usage: bash bench/rdzv_bench.sh [build-dir]   (figures: docs/bench-rendezvous.md)
# `make bench` runs it on its own build (RelWithDebInfo, with LibTorch), which has all three
# programs; the script builds those missing from an existing build directory.
# Build the benchmarks optimised, as TCPStore is:
#   cmake -S . -B build-rdzv-rel -G Ninja -DDDPL_WITH_TORCH=OFF -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-rdzv-rel -j2 --target rdzv_store_bench rdzv_scale_bench
# Each store configuration runs REPEAT times (default 3), the two sides interleaved, and the
# run with the median throughput is reported for each side: the machine is shared and noisy.
# The bootstrap runs BOOT_REPEAT times per side (default 3 x REPEAT) at RANKS (8,64,256,1024),
# and all ranks at once at RANKS_TOGETHER (256,1024); AGENTS sets the scale section's sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
PY="${DDPL_PYTHON:-.venv/bin/python}"
ROUNDS="${ROUNDS:-200}"
REPEAT="${REPEAT:-3}"
BIN="$BUILD_DIR/bin"
want="rdzv_store_bench rdzv_scale_bench grpc_floor_bench rdzv-server"
grep -q '^DDPL_WITH_TORCH:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null && want+=" rdzv_bootstrap_bench"
missing=""
for b in $want; do [ -x "$BIN/$b" ] || missing+=" $b"; done
[ -z "$missing" ] || cmake --build "$BUILD_DIR" --target $missing
for b in rdzv_store_bench rdzv_scale_bench grpc_floor_bench rdzv-server; do
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

AGENTS="${AGENTS:-64,256,1024,4096,16384}"
echo "== rendezvous scale: N agents join one round (targets: 4096 in < 1000 ms, 16384 in < 2000 ms)"
echo "   standalone: the server in a process of its own, as every multi-node job has it (an"
echo "   rdzv-server, or the agent that hosts the endpoint with its own one join): the targets' line."
echo "   embedded: the server in the N agents' own process (a harness shortcut; above 4096 agents"
echo "   it measures gRPC's debug checks on calls the two sides share, docs/bench-rendezvous.md §9)"
"$BIN/rdzv_scale_bench" --agents "$AGENTS" 2>/dev/null
# The agents' 16 channels share one connection here: the server must take the largest N calls
# on it at once (real agents come on a connection each).
most=$(tr ',' '\n' <<<"$AGENTS" | sort -n | tail -1)
port_file=$(mktemp)
"$BIN/rdzv-server" --port 0 --port-file "$port_file" --log-level warn \
  --max-streams-per-connection $((most + 64)) 2>/dev/null &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true; rm -f "$port_file"' EXIT
for _ in $(seq 100); do [ -s "$port_file" ] && break; sleep 0.1; done
[ -s "$port_file" ] || { echo "rdzv-server did not start within 10 s" >&2; exit 1; }
"$BIN/rdzv_scale_bench" --agents "$AGENTS" --endpoint "127.0.0.1:$(cat "$port_file")" 2>/dev/null
kill "$server_pid" && wait "$server_pid" 2>/dev/null || true

echo "== store: NCCL-bootstrap pattern (set, add, get, wait), $ROUNDS rounds, median of $REPEAT"
echo "   socket: our store on the server's plain socket (the default); grpc: on the gRPC Session stream"
printf '%-8s %11s %11s %11s %7s %7s %8s %8s %8s %8s %8s %8s\n' clients socket_ops/s grpc_ops/s \
  tcp_ops/s sock/tcp grpc/tcp sock_p50 grpc_p50 tcp_p50 sock_p99 grpc_p99 tcp_p99
for c in 1 16 64; do
  ss="" gs="" ts=""
  for _ in $(seq "$REPEAT"); do
    ss+=$("$BIN/rdzv_store_bench" --clients "$c" --rounds "$ROUNDS" 2>/dev/null)$'\n'
    gs+=$("$BIN/rdzv_store_bench" --clients "$c" --rounds "$ROUNDS" --grpc-stream 2>/dev/null)$'\n'
    ts+=$("$PY" bench/rdzv_tcpstore_bench.py --clients "$c" --rounds "$ROUNDS" 2>/dev/null |
      grep impl=)$'\n'
  done
  s=$(median <<<"$ss"); g=$(median <<<"$gs"); t=$(median <<<"$ts")
  st=$(field ops_per_s "$s"); gt=$(field ops_per_s "$g"); tt=$(field ops_per_s "$t")
  printf '%-8s %11s %11s %11s %7s %7s %8s %8s %8s %8s %8s %8s\n' "$c" "$st" "$gt" "$tt" \
    "$(awk -v a="$st" -v b="$tt" 'BEGIN { printf "%.2f", a / b }')" \
    "$(awk -v a="$gt" -v b="$tt" 'BEGIN { printf "%.2f", a / b }')" \
    "$(field p50_us "$s")" "$(field p50_us "$g")" "$(field p50_us "$t")" \
    "$(field p99_us "$s")" "$(field p99_us "$g")" "$(field p99_us "$t")"
done

# What any gRPC store could reach here: a Session stream whose server answers at once, against
# TCPStore's add (docs/bench-rendezvous.md §7). One op at a time per client.
echo "== gRPC round-trip floor (no store behind it) vs TCPStore add, median of $REPEAT"
printf '%-8s %-9s %-7s %12s %12s %8s %10s %10s\n' clients server conn grpc_ops/s tcp_add_ops/s \
  ratio grpc_p50us tcp_p50us
for c in 1 16 64; do
  ops=$((20000 / c))
  ts=""
  for _ in $(seq "$REPEAT"); do
    ts+=$("$PY" bench/rdzv_tcpstore_bench.py --clients "$c" --rounds "$ops" --add-only |
      grep impl=) || { echo "TCPStore --add-only failed at $c clients" >&2; exit 1; }
    ts+=$'\n'
  done
  t=$(median <<<"$ts"); tt=$(field ops_per_s "$t")
  for mode in callback:shared sync:shared async:shared; do
    gs=""
    for _ in $(seq "$REPEAT"); do
      gs+=$("$BIN/grpc_floor_bench" --server "${mode%%:*}" --connection "${mode##*:}" \
        --clients "$c" --ops "$ops") || { echo "grpc_floor_bench failed: $mode, $c clients" >&2; exit 1; }
      gs+=$'\n'
    done
    g=$(median <<<"$gs"); gt=$(field ops_per_s "$g")
    printf '%-8s %-9s %-7s %12s %12s %8s %10s %10s\n' "$c" "${mode%%:*}" "${mode##*:}" "$gt" "$tt" \
      "$(awk -v a="$gt" -v b="$tt" 'BEGIN { printf "%.2f", a / b }')" \
      "$(field p50_us "$g")" "$(field p50_us "$t")"
  done
done

# Process-group bootstrap through c10d (needs the LibTorch build: `make bench`'s build has it).
if [ -x "$BIN/rdzv_bootstrap_bench" ]; then
  # A run takes a second or less, the machine's noise is larger than the stores' difference:
  # more runs than the store's REPEAT, so that the medians hold still.
  boot_repeat="${BOOT_REPEAT:-$((REPEAT * 3))}"
  echo "== process-group bootstrap: N rank threads, start to first completed barrier, $boot_repeat runs each"
  echo "   staggered: ranks start as the harness creates their threads; together: all threads exist"
  echo "   first and leave one gate at once (every rank's connect in one burst)"
  # Bounded: Gloo's full mesh once hung in a TCP connect between two rank threads past its own
  # timeout; what finished before is still reported.
  out=$(timeout "${BOOTSTRAP_TIMEOUT:-900}" "$BIN/rdzv_bootstrap_bench" --ranks "${RANKS:-8,64,256,1024}" \
    --repeat "$boot_repeat" 2>/dev/null | grep '^impl=' || true)
  out+=$'\n'$(timeout "${BOOTSTRAP_TIMEOUT:-900}" "$BIN/rdzv_bootstrap_bench" \
    --ranks "${RANKS_TOGETHER:-256,1024}" --repeat "$boot_repeat" --gloo-max 0 --start together \
    2>/dev/null | grep '^impl=' || true)
  echo "$out"
  printf '%-6s %-9s %6s %13s %13s %13s %9s %9s %11s %11s\n' mode start ranks socket_ms grpc_ms tcp_ms \
    tcp/sock tcp/grpc sock_after tcp_after
  # Median over the runs of each side; ratios = TCPStore's time / ours (above 1: ours is faster).
  # *_after: the median after_barrier_ms, the part of a run that is the store alone (releasing
  # the barrier's waiters and serving their last get); the rest is mostly creating N threads.
  awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
         if (f["mode"] == "") next
         k = f["mode"] " " f["start"] " " f["ranks"]; m = ++n[k, f["impl"]]
         v[k, f["impl"], m] = f["ms"]; w[k, f["impl"], m] = f["after_barrier_ms"]; keys[k] = 1 }
       function med(a, k, impl,   m, i, j, t, x) {
         m = n[k, impl]; for (i = 1; i <= m; i++) x[i] = (a == "v") ? v[k, impl, i] : w[k, impl, i]
         for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
         return x[int((m + 1) / 2)] }
       END { for (k in keys) { split(k, p, " "); s = med("v", k, "socket"); g = med("v", k, "grpc"); t = med("v", k, "tcpstore")
             printf "%-6s %-9s %6s %13.1f %13.1f %13.1f %9.2f %9.2f %11.1f %11.1f\n", p[1], p[2], p[3], s, g, t,
               t / s, t / g, med("w", k, "socket"), med("w", k, "tcpstore") } }' <<<"$out" | sort -k1,1 -k2,2 -k3n
else
  echo "(no $BIN/rdzv_bootstrap_bench: the process-group bootstrap benchmark needs -DDDPL_WITH_TORCH=ON)"
fi
