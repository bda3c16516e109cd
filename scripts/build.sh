#!/usr/bin/env bash
# Configure once (Ninja, ccache, LibTorch from the venv's torch), then build incrementally:
#   bash scripts/build.sh BUILD_DIR JOBS            # everything (make build, make test)
#   bash scripts/build.sh BUILD_DIR JOBS T1 T2 ...  # those targets that this configuration has
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; JOBS="${2:-$(nproc)}"
shift $(( $# < 2 ? $# : 2 ))
TORCH_PREFIX="$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DDDPL_PYTHON="$PWD/.venv/bin/python"
fi
if [ $# -eq 0 ]; then
  exec cmake --build "$BUILD_DIR" -j "$JOBS"
fi
# A target this configuration lacks (ddp_resnet without LibTorch, the gRPC plugin on a bare GPU
# host) is left out rather than failing the build: the caller falls back on what exists.
known="$(ninja -C "$BUILD_DIR" -t targets all | sed -n 's/^\([A-Za-z0-9_.+-]*\): .*/\1/p')"
targets=()
for t in "$@"; do
  if grep -qx -- "$t" <<<"$known"; then targets+=("$t"); fi
done
exec cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"
