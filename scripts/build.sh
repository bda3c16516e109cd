#!/usr/bin/env bash
# Configure once (Ninja, ccache, LibTorch from the venv's torch), then build incrementally.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; JOBS="${2:-$(nproc)}"
TORCH_PREFIX="$(.venv/bin/python -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" -DDDPL_PYTHON="$PWD/.venv/bin/python"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
