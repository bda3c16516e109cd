#!/usr/bin/env bash
# The whole suite: unit, integration, fault and Python-compat tests, all through CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
# Most cases wait on processes, sockets and timeouts rather than compute: TEST_JOBS (default 4)
# run at once on two cores. The cases that keep two cores busy count as two (PROCESSORS), the
# ones that judge a process by its CPU rate run alone (RUN_SERIAL): cmake/DdplHelpers.cmake.
# Each test carries its own timeout.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${TEST_JOBS:-4}" --timeout 600
# Then the rendezvous and launcher suites again under ASan + UBSan, in build-asan (no LibTorch;
# a few minutes with ccache warm). DDPL_TEST_ASAN=0 skips it.
if [ "${DDPL_TEST_ASAN:-1}" != 0 ]; then
  bash scripts/test_sanitized.sh asan
fi
