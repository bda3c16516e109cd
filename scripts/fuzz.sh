#!/usr/bin/env bash
# libFuzzer over the request handling, the store socket's server, the CLI and hostfile parsers,
# and what a worker or a peer controls in launch: error files and the failure report, secret
# masking, output routing, heartbeats, the dashboard's rows, manifests, the replica protocol.
# Configures build-fuzz once (clang, ASan + UBSan on every library, no LibTorch), builds the
# targets, then runs each for FUZZ_SECONDS (default 60) starting from its seed corpus in
# tests/fuzz/corpus/<target>/ (new inputs go to build-fuzz/corpus/<target>/, never into git).
# Exits non-zero when a target finds a crash, a leak or a sanitizer report; the reproducer is
# left in build-fuzz/ (crash-*, leak-*, ...) and named in the target's log.
#   FUZZ_SECONDS=600 FUZZ_TARGETS=fuzz_requests bash scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${FUZZ_BUILD_DIR:-build-fuzz}"
SECONDS_EACH="${FUZZ_SECONDS:-60}"
JOBS="${JOBS:-$(nproc)}"
TARGETS="${FUZZ_TARGETS:-fuzz_requests fuzz_wire fuzz_tcpstore fuzz_cli fuzz_hostfile fuzz_error_file
  fuzz_mask fuzz_output fuzz_heartbeat fuzz_dashboard fuzz_manifest fuzz_replica}"
SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDDPL_WITH_TORCH=OFF -DDDPL_WITH_MPI=OFF -DDDPL_BUILD_TESTS=OFF -DDDPL_BUILD_BENCH=OFF \
    -DDDPL_BUILD_FUZZ=ON -DCMAKE_C_FLAGS="$SAN" -DCMAKE_CXX_FLAGS="$SAN" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
fi
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "$JOBS" --target $TARGETS
status=0
for t in $TARGETS; do
  mkdir -p "$BUILD_DIR/corpus/$t"
  echo "fuzz: $t for ${SECONDS_EACH}s"
  if ! (cd "$BUILD_DIR" && "fuzz/$t" -max_total_time="$SECONDS_EACH" -max_len=4096 \
          -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
          "corpus/$t" "../tests/fuzz/corpus/$t" >"$t.log" 2>&1); then
    echo "fuzz: $t FOUND SOMETHING, see $BUILD_DIR/$t.log:"
    grep -E "ERROR|SUMMARY|Test unit written" "$BUILD_DIR/$t.log" | head -20
    status=1
  fi
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|^stat::peak_rss_mb" \
    "$BUILD_DIR/$t.log" | sed "s/^/fuzz: $t /"
done
exit $status
