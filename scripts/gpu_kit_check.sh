#!/usr/bin/env bash
# `make gpu-kit-check`: the lent GPU host's build, rehearsed here before any GPU sees it
# (docs/gpu.md). As that host has them:
#  - its toolchain: a compiler whose libstdc++ exists only as a static archive (GCC 13 at
#    /opt/gcc there; here scripts/static_only_cxx.sh makes one from Debian's GCC);
#  - its LibTorch: torch DDPL_KIT_TORCH (default 2.11.0, the host's) from PyPI, in a venv of its
#    own (.venv-torch-<version>, made once; pip's cache makes a second one quick), next to the
#    pinned torch of .venv;
#  - its missing packages: tests/gpu/run_gpu_checks.sh's unpack and build steps
#    (DDPL_GPU_BUILD_ONLY=1) run in a private mount namespace where the Debian development
#    packages the kit replaces are hidden (empty directories and files mounted over them), so
#    that a header or CMake package missing from the kit fails here, not on the GPU host.
# Then, with what that build made: the throw-site check (a C++ rank's exception named where it
# was thrown), worker_rank's DDP equivalence on 2 CPU ranks (Gloo) under the kit's launch, and
# one C++ runtime in worker_rank (LibTorch's shared libstdc++.so.6, no static copy).
# Needs root (unshare -m); 10-20 minutes on 2 cores the first time (ccache after). It builds in
# ~/.cache/ddplaunch/gpu-kit-check (private to the user; outside the source tree, where CMake
# refuses the kit's include directories for exported targets).
#   bash scripts/gpu_kit_check.sh [OUT_DIR]     (default <that directory>/out)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
bash scripts/gpu_kit.sh
WORK=${XDG_CACHE_HOME:-$HOME/.cache}/ddplaunch/gpu-kit-check
mkdir -p "$WORK"
chmod 700 "$WORK"
OUT=${1:-$WORK/out}
mkdir -p "$OUT"
TORCH=${DDPL_KIT_TORCH:-2.11.0}
VENV=$ROOT/.venv-torch-$TORCH
if ! "$VENV/bin/python" -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
  echo "gpu-kit-check: installing torch==$TORCH into $VENV (the GPU host's LibTorch; large download, once)"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH" numpy
fi
CXX_STATIC=$(bash scripts/static_only_cxx.sh "$WORK/static-only-toolchain")
echo "gpu-kit-check: torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), compiler $CXX_STATIC (libstdc++.a only)"
export DDPL_GPU_BUILD=$WORK/build DDPL_KIT_PREFIX=$WORK/kit
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
trap 'rmdir "$empty" 2>/dev/null || true' EXIT
script="set -e"
for d in "${HIDE_DIRS[@]}"; do [ -d "$d" ] && script+="; mount --bind $empty $d"; done
for f in "${HIDE_FILES[@]}"; do [ -e "$f" ] && script+="; mount --bind /dev/null $f"; done
script+="; test ! -e /usr/include/spdlog/spdlog.h"
# The kit-check's own run has no lent machine's clock: the steps get the time a 2-core build needs.
script+="; CXX=$CXX_STATIC DDPL_GPU_DEADLINE=7200 DDPL_GPU_LIMIT_SCALE=8 DDPL_GPU_BUILD_ONLY=1 DDPL_PYTHON=$VENV/bin/python"
script+=" bash tests/gpu/run_gpu_checks.sh $OUT"
unshare -m --propagation private bash -c "$script"
BUILD=$DDPL_GPU_BUILD
# One C++ runtime: LibTorch's shared one, and no static copy inside the program.
runtimes=$(ldd "$BUILD/tests/worker_rank" | grep -c "libstdc++" || true)
[ "$runtimes" = 1 ] || { echo "gpu-kit-check: worker_rank links $runtimes libstdc++ (expected LibTorch's alone)"; exit 1; }
if nm --defined-only "$BUILD/tests/worker_rank" | grep -qwE "__cxa_throw|__cxa_begin_catch"; then
  echo "gpu-kit-check: worker_rank carries a static copy of the C++ runtime"; exit 1
fi
# What the kit build made runs here too (Gloo on CPU; the kit's libdw found by run path).
OMP_NUM_THREADS=1 "$BUILD/bin/launch" --nproc-per-node=2 --no-python "$BUILD/tests/worker_rank" equivalence
echo "gpu-kit-check: with a static-only libstdc++ and torch $TORCH, the kit builds launch, worker_rank and ddp_resnet (system development packages hidden); worker_rank has one C++ runtime, names its throw sites and runs on 2 CPU ranks"
