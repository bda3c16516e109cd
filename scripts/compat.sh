#!/usr/bin/env bash
# `make compat TORCH="2.6.0 2.8.0 2.9.1 2.11.0 2.15.0"`: the torch version matrix
# (docs/compat.md). For each version:
#  - a venv with that torch from PyPI, made once and kept (.venv-torch-<version> beside .venv,
#    about 5 GB: PyPI's wheels are CUDA builds); the pinned version is .venv itself;
#  - the Python checks of scripts/compat.py under launch, with that torch's interpreter, client,
#    server and torchrun (the agent store's conformance, 2- and 4-rank Gloo jobs killed and
#    restarted, --prewarm=torch, the memory checkpoint and its DCP writer/reader, the @record
#    error file, the workers' environment against torchrun's);
#  - the worker library and ddp_resnet built against that LibTorch in build-torch-<version>/
#    (the C++ standard it requires chosen by cmake/DdplTorch.cmake), and worker_rank's DDP
#    equivalence on 2 CPU ranks, where a user could pair that LibTorch with this build;
#  - for the newest version, the test cases that skip without a newer torch than the pinned one
#    (tests/allowed_skips.txt).
# Then the results (JSON per version in $COMPAT_OUT) become the table of docs/compat.md.
# Not part of `make test` or CI: it downloads a torch per version (about 5 GB each installed).
#   bash scripts/compat.sh [VERSION...]
# COMPAT_VENV_ROOT: where the .venv-torch-<version> live (default: beside the real .venv, so that
# a worktree whose .venv links to the main checkout's shares them); BUILD_DIR (build), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
VENV_ROOT=${COMPAT_VENV_ROOT:-$(dirname "$(readlink -f .venv)")}
OUT=${COMPAT_OUT:-$ROOT/$BUILD_DIR/compat}
VERSIONS=$(printf '%s\n' "${@:-2.6.0 2.8.0 2.9.1 2.11.0 2.15.0}" | tr ' ' '\n' | grep . | sort -uV)
NEWEST=$(tail -n1 <<<"$VERSIONS")
COMMAND="make compat TORCH=\"$(tr '\n' ' ' <<<"$VERSIONS" | sed 's/ $//')\""

[ -x .venv/bin/python ] || { echo "compat: no .venv here: run 'make setup' first"; exit 1; }
PINNED=$(.venv/bin/python -c 'import torch; print(torch.__version__.split("+")[0])')
# The venvs are made with the pinned venv's own interpreter: the same Python for every version.
BASE_PYTHON=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
mkdir -p "$OUT"
rm -f "$OUT"/torch-*.json

echo "compat: building launch and the test programs in $BUILD_DIR"
bash scripts/build.sh "$BUILD_DIR" "$JOBS" launch ddpl_launch_grpc launcher_python_test \
  agent_store_test
LAUNCH=$ROOT/$BUILD_DIR/bin/launch

has_torch() {  # has_torch PYTHON VERSION
  "$1" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$2')" 2>/dev/null
}

# venv_for VERSION: prints the interpreter, or fails with pip's reason on the last line.
venv_for() {
  local v=$1 venv=$VENV_ROOT/.venv-torch-$1
  if [ "$v" = "$PINNED" ]; then echo "$ROOT/.venv/bin/python"; return; fi
  if ! has_torch "$venv/bin/python" "$v"; then
    echo "compat: installing torch==$v into $venv (from PyPI, once)" >&2
    rm -rf "$venv"
    "$BASE_PYTHON" -m venv "$venv" >&2
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$v" numpy \
        >"$OUT/install-$v.log" 2>&1; then
      rm -rf "$venv"
      grep -E "ERROR|error" "$OUT/install-$v.log" | head -n1
      return 1
    fi
  fi
  echo "$venv/bin/python"
}

# cxx_build VERSION PYTHON: "ok", or "failed: <first error>", or "skipped: why".
cxx_build() {
  local v=$1 py=$2 dir=$ROOT/build-torch-$1 prefix abi
  if ! abi=$("$py" -c 'import torch; print(int(torch.compiled_with_cxx11_abi()))' 2>&1); then
    echo "failed: torch does not import: $(tail -n1 <<<"$abi")"
    return
  fi
  if [ "$abi" != 1 ]; then
    echo "skipped: torch $v's wheel is built with the pre-C++11 ABI (_GLIBCXX_USE_CXX11_ABI=0), while the worker library links the system's spdlog, fmt and gRPC, built with the C++11 ABI: no user can pair this LibTorch with our build"
    return
  fi
  prefix=$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  echo "compat: building worker_rank and ddp_resnet against torch $v in $dir" >&2
  if ! { cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           -DCMAKE_PREFIX_PATH="$prefix" -DDDPL_PYTHON="$py" -DDDPL_BUILD_TESTS=OFF \
           -DDDPL_BUILD_BENCH=OFF -DDDPL_BUILD_GPU_CHECKS=ON &&
         cmake --build "$dir" -j "$JOBS" --target worker_rank ddp_resnet; } \
      >"$OUT/build-torch-$v.log" 2>&1; then
    echo "failed: $(grep -m1 -E 'error|Error' "$OUT/build-torch-$v.log" | cut -c1-300) (log: $OUT/build-torch-$v.log)"
    return
  fi
  echo ok
}

status=0
for v in $VERSIONS; do
  echo "compat: ===== torch $v"
  args=(--torch "$v" --launch "$LAUNCH" --out "$OUT/torch-$v.json")
  [ "$v" = "$PINNED" ] && args+=(--pinned)
  if py=$(venv_for "$v"); then
    args+=(--python "$py" --cxx-build "$ROOT/build-torch-$v" --cxx-status "$(cxx_build "$v" "$py")")
    if [ "$v" = "$NEWEST" ] && [ "$v" != "$PINNED" ]; then
      # The cases find the newer torch beside the pinned venv, and the 2.15 one under the
      # source tree itself (tests/integration/agent_store_test.cc).
      if [ ! -e "$ROOT/.venv-torch-$v" ]; then ln -s "$VENV_ROOT/.venv-torch-$v" "$ROOT/.venv-torch-$v"; fi
      args+=(--gtest "$ROOT/$BUILD_DIR/tests")
    fi
  else
    args+=(--python none --install-error "pip install torch==$v failed: ${py:-see $OUT/install-$v.log}")
  fi
  .venv/bin/python scripts/compat.py check "${args[@]}" || status=1
done
.venv/bin/python scripts/compat.py render --results "$OUT" --doc docs/compat.md --command "$COMMAND"
exit $status
