#!/usr/bin/env bash
# The main job a new user sees: the C++ ResNet DDP example (examples/ddp_resnet) on 2 CPU ranks
# started by our `launch`: a narrow ResNet-18 on the built-in synthetic image set, a few minutes
# on 2 cores. DEMO_ARGS adds or overrides ddp_resnet's options (`ddp_resnet --help`), e.g.
#   make demo DEMO_ARGS="--epochs 8 --width 32"
# Without LibTorch (no ddp_resnet built) it falls back to a 4-rank PyTorch DDP script over Gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"
LAUNCH="$BUILD_DIR/bin/launch"
if [ -x "$BUILD_DIR/bin/ddp_resnet" ]; then
  # Checkpoints in the build tree, not the source tree; a rerun starts afresh (--resume continues).
  set -x
  exec "$LAUNCH" --standalone --nproc-per-node=2 "$BUILD_DIR/bin/ddp_resnet" \
    --checkpoint-dir "$BUILD_DIR/demo-checkpoints" ${DEMO_ARGS:-}
fi
export PYTHON_EXEC="$PWD/.venv/bin/python"
set -x
exec "$LAUNCH" --standalone --nproc-per-node=4 tests/python/ddp_gloo.py
