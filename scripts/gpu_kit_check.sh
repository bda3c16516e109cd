#!/usr/bin/env bash
# `make gpu-kit-check`: the GPU host's build, tried here. Runs tests/gpu/run_gpu_checks.sh's
# unpack and build steps (DDPL_GPU_BUILD_ONLY=1) in a private mount namespace where the
# Debian development packages the kit replaces are hidden (empty directories and files mounted
# over them), so that a header or CMake package missing from the kit fails here, not on the
# GPU host. Then starts the kit-built worker_rank on 2 ranks under the kit-built launch (Gloo,
# on CPU: what this machine can run). Needs root (unshare -m); takes 10-20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/gpu_kit.sh
OUT=${1:-/tmp/ddpl-gpu-kit-check}
mkdir -p "$OUT"
HIDE_DIRS=(/usr/include/spdlog /usr/include/fmt /usr/include/nlohmann /usr/include/gloo
           /usr/include/elfutils /usr/include/grpc /usr/include/grpcpp /usr/include/grpc++
           /usr/include/google /usr/include/absl /usr/include/prometheus /usr/include/CLI
           /usr/include/gtest /usr/include/gmock /usr/include/benchmark
           /usr/lib/x86_64-linux-gnu/cmake/spdlog /usr/lib/x86_64-linux-gnu/cmake/fmt
           /usr/lib/x86_64-linux-gnu/cmake/gRPC /usr/lib/x86_64-linux-gnu/cmake/protobuf
           /usr/lib/x86_64-linux-gnu/cmake/absl /usr/lib/x86_64-linux-gnu/cmake/prometheus-cpp
           /usr/lib/x86_64-linux-gnu/cmake/GTest /usr/share/cmake/nlohmann_json
           /usr/lib/x86_64-linux-gnu/openmpi/include)
HIDE_FILES=(/usr/include/libelf.h /usr/include/gelf.h /usr/include/civetweb.h
            /usr/lib/x86_64-linux-gnu/libdw.so /usr/lib/x86_64-linux-gnu/libelf.so
            /usr/lib/x86_64-linux-gnu/libspdlog.so /usr/lib/x86_64-linux-gnu/libfmt.so)
empty=$(mktemp -d)
script="set -e"
for d in "${HIDE_DIRS[@]}"; do [ -d "$d" ] && script+="; mount --bind $empty $d"; done
for f in "${HIDE_FILES[@]}"; do [ -e "$f" ] && script+="; mount --bind /dev/null $f"; done
script+="; test ! -e /usr/include/spdlog/spdlog.h"
script+="; DDPL_GPU_BUILD_ONLY=1 DDPL_PYTHON=$PWD/.venv/bin/python bash tests/gpu/run_gpu_checks.sh $OUT"
unshare -m --propagation private bash -c "$script"
rmdir "$empty"
BUILD=${DDPL_GPU_BUILD:-/tmp/ddpl-gpu-build}
# What the kit build made runs here too (Gloo on CPU; the kit's libdw found by run path).
"$BUILD/bin/launch" --nproc-per-node=2 --no-python "$BUILD/tests/worker_rank" equivalence
echo "gpu-kit-check: the kit builds launch, worker_rank and ddp_resnet with the system's development packages hidden, and worker_rank runs"
