#!/usr/bin/env bash
# The C++ suites that do not load LibTorch (rendezvous and launcher) under a sanitizer, in a
# build directory of their own configured without LibTorch:
#   bash scripts/test_sanitized.sh asan   # AddressSanitizer + UndefinedBehaviorSanitizer, build-asan
#   bash scripts/test_sanitized.sh tsan   # ThreadSanitizer, build-tsan
# Left out: tests whose workers are Python programs importing torch (MultiNode, AgentStore, EtcdRendezvous,
# LaunchPython, the MPI job tests, the slurm/netns scripts) and the Python manifest check; they
# test no more C++ than the ones kept and take minutes under a sanitizer on two cores. The
# programs holding nothing else (multinode_test, etcd_rendezvous_test, agent_store_test) are not even built
# (DDPL_SANITIZED_SUBSET).
# TSan also leaves out the suites that run gRPC (the gRPC store and service, membership, TLS,
# the rdzv-server binary, --standalone): Debian's gRPC, Abseil and protobuf are not built with
# TSan, so it cannot see the locks that order gRPC's threads and reports every hand-off
# between them. Measured on rdzv_store_service_test (10 tests, 2026-12-01): 567 reports; with
# ignore_noninstrumented_modules=1 and `race_top:` suppressions for gRPC's inline headers
# (/usr/include/grpcpp/, grpc::internal::), still 124, now in std::function and protobuf code
# inlined into gRPC's callback paths and in our reactors' members written on the thread that
# created them and read on the gRPC thread that calls them back (ordered by gRPC's core, which
# TSan does not see). They need a TSan-built gRPC, Abseil and protobuf; ASan covers them here.
# What stays is the code whose threads are ours: the state machine, KvSpace and TimerQueue,
# the memory/file/prefix stores, the launcher.
# Ends with what did not run and why (scripts/test_report.py; DDPL_TEST_REPORT=0 leaves that to
# the caller, which runs `test_sanitized.sh KIND report` later: scripts/test.sh): a skip that
# tests/allowed_skips.txt does not allow for this pass fails it, as does a missing suite other
# than those this tree leaves out on purpose (LibTorch's, and the programs named above).
set -euo pipefail
cd "$(dirname "$0")/.."
KIND="${1:?asan or tsan}"
ACTION="${2:-run}"
EXTRA_EXCLUDE=""
JOBS="${JOBS:-$(nproc)}"
case "$KIND" in
  asan)
    BUILD_DIR="${SAN_BUILD_DIR:-build-asan}"
    FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
    export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
    ;;
  tsan)
    BUILD_DIR="${SAN_BUILD_DIR:-build-tsan}"
    FLAGS="-fsanitize=thread -fno-omit-frame-pointer"
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp${TSAN_OPTIONS:+:$TSAN_OPTIONS}"
    EXTRA_EXCLUDE='|/Grpc|^(StoreServiceTest|TlsTest|MembershipTest|RdzvFaultTest|ServerBinaryTest|StoreSessionTest|HugeNumbersTest|StoreOpListTest|HostileClientTest|LongUptimeTest)\.|Standalone'
    ;;
  *) echo "usage: $0 asan|tsan [report]" >&2; exit 2 ;;
esac
JUNIT="$(realpath -m "$BUILD_DIR")/Testing/ddpl-junit.xml"
report() {
  python3 scripts/test_report.py --build "$BUILD_DIR" --junit "$JUNIT" --pass "$KIND" \
    --left-out torch,full --filtered-ok
}
if [ "$ACTION" = report ]; then
  report
  exit
fi
# A tree configured before DDPL_SANITIZED_SUBSET existed is configured again once, with it.
if [ ! -f "$BUILD_DIR/build.ninja" ] ||
   ! grep -q '^DDPL_SANITIZED_SUBSET:BOOL=ON' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDDPL_WITH_TORCH=OFF \
    -DDDPL_BUILD_BENCH=OFF -DDDPL_SANITIZED_SUBSET=ON -DDDPL_PYTHON="$PWD/.venv/bin/python" \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
    -DCMAKE_EXE_LINKER_FLAGS="$FLAGS" -DCMAKE_SHARED_LINKER_FLAGS="$FLAGS" \
    -DCMAKE_MODULE_LINKER_FLAGS="$FLAGS"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
# Two cases at once, not the main suite's four: a sanitized server runs 2-3x slower, and the
# cases that bound a hostile client wait for it with margins made for the main build (at four
# at once beside a packaging case, one waited past 20 s for what takes 2 s alone).
# package_test and python_progress_test are left out too: they test packaging and Python, no C++
# that the sanitizer would see.
mkdir -p "$BUILD_DIR/Testing"
rm -f "$JUNIT"
status=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${SAN_TEST_JOBS:-2}" --timeout 600 \
  --test-output-truncation middle --output-junit "$JUNIT" \
  -E "^(MultiNode|EtcdRendezvous|LaunchPython|Mpi(Example|Failure|Launch|Worker))\\.|^(slurm_test|netns_test|deploy_manifests_test|wheel_test|package_test|python_progress_test)\$${EXTRA_EXCLUDE:-}" \
  || status=1
if [ "${DDPL_TEST_REPORT:-1}" != 0 ]; then
  echo
  report || status=1
fi
exit "$status"
