#!/usr/bin/env bash
# The main job a new user sees. Runs the C++ ResNet DDP example when it is built; until then, a
# 4-rank PyTorch DDP script over Gloo, both started by our `launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
LAUNCH="$BUILD_DIR/bin/launch"
if [ -x "$BUILD_DIR/bin/ddp_resnet" ]; then
  set -x
  exec "$LAUNCH" --standalone --nproc-per-node=2 "$BUILD_DIR/bin/ddp_resnet" ${DEMO_ARGS:-}
fi
export PYTHON_EXEC="$PWD/.venv/bin/python"
set -x
exec "$LAUNCH" --standalone --nproc-per-node=4 tests/python/ddp_gloo.py
