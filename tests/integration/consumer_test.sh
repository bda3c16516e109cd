#!/usr/bin/env bash
# ddplaunch as another project uses it: this build installed into a temporary prefix (then moved,
# so nothing may depend on where it was installed), tests/consumer copied out of the source tree,
# configured with find_package(ddplaunch) alone, built, and run on 2 ranks under the INSTALLED
# launch, over the TCPStore and (--standalone) over the installed gRPC plugin and store client.
# Also: only the public headers are installed, a too-new version request is refused, a wrong
# LibTorch is refused by name, and a program that runs find_package(Torch) first still links.
# Usage: consumer_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC="$1"
BUILD="$2"
T=$(mktemp -d /tmp/ddpl-consumer-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "consumer_test: FAIL: $*" >&2; exit 1; }
step() { echo "consumer_test: $* ($((SECONDS))s)"; }

cmake --install "$BUILD" --prefix "$T/installed" > "$T/install.log" || fail "install: $(cat "$T/install.log")"
mv "$T/installed" "$T/prefix"
P="$T/prefix"
step "installed"

for f in bin/launch bin/rdzv-server lib/libddpl_launch_grpc.so lib/libddpl_worker.a \
         include/ddplaunch/worker/session.h include/ddplaunch/worker/ddp.h \
         lib/cmake/ddplaunch/ddplaunchConfig.cmake lib/cmake/ddplaunch/ddplaunchConfigVersion.cmake; do
  [ -e "$P/$f" ] || fail "$f missing from the installed prefix"
done
# Public headers only: no generated protobuf/gRPC header, no internal one.
internal=$(cd "$P/include" && find . -name '*.pb.h' -o -name 'pch.h' -o -name 'backends.h' \
           -o -name 'mpi_bootstrap.h' -o -name 'grpc_*.h' -o -name 'config.h')
[ -z "$internal" ] || fail "internal headers installed: $internal"
# Relocatable: the only path of this machine left in the package is the LibTorch default.
leaked=$(grep -rn -e "$BUILD" -e "$SRC" "$P/lib/cmake" "$P/include" | grep -v '_ddpl_built_torch_dir' || true)
[ -z "$leaked" ] || fail "build or source paths in the installed package: $leaked"

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
launcher=()
if command -v ccache >/dev/null; then
  # Paths under $T differ every run; relative to it, the compile is the same one each time.
  export CCACHE_BASEDIR="$T" CCACHE_NOHASHDIR=true
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
configure() {  # configure SOURCE BUILD [ARGS...]
  local src="$1" dir="$2"; shift 2
  cmake -S "$src" -B "$dir" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$P" "$@" > "$dir.log" 2>&1
}

# Version: 0.x promises only the same minor version, and says which one it has.
mkdir "$T/version"
cat > "$T/version/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.25)
project(version_check NONE)
find_package(ddplaunch 99 CONFIG)
message(STATUS "ddplaunch found: ${ddplaunch_FOUND}")
EOF
configure "$T/version" "$T/version-build" || fail "version check: $(cat "$T/version-build.log")"
grep -q "ddplaunch found: 0" "$T/version-build.log" || fail "ddplaunch 99 accepted: $(cat "$T/version-build.log")"
grep -q 'version: [0-9]' "$T/version-build.log" || fail "no version in: $(cat "$T/version-build.log")"

cp -r "$SRC/tests/consumer" "$T/src"
# A LibTorch the user points at that is not one is refused, naming it (before any compile).
if configure "$T/src" "$T/bad-torch" -DDDPLAUNCH_TORCH_DIR="$T/no-torch"; then
  fail "configured with DDPLAUNCH_TORCH_DIR=$T/no-torch"
fi
grep -q "no LibTorch at DDPLAUNCH_TORCH_DIR=$T/no-torch" "$T/bad-torch.log" \
  || fail "unclear error for a wrong LibTorch: $(cat "$T/bad-torch.log")"
step "version and LibTorch checks"

configure "$T/src" "$T/build" || fail "configure: $(cat "$T/build.log")"
cmake --build "$T/build" > "$T/build-out.log" 2>&1 || fail "build: $(cat "$T/build-out.log")"
step "consumer built"

# run NAME [LAUNCH OPTIONS...]: 2 ranks under the installed launch, from the consumer's build dir.
run() {
  local name="$1"; shift
  local out
  out=$(cd "$T/build" && env OMP_NUM_THREADS=1 DDPL_BACKEND=gloo \
        "$P/bin/launch" "$@" --nproc-per-node 2 ./train "$T/$name.pt" 2>&1) \
    || fail "$name: launch failed: $out"
  local weights=()
  for r in 0 1; do
    local line
    line=$(echo "$out" | grep "^\[default$r\]:consumer rank $r/2: 8 steps") \
      || fail "$name: rank $r did not finish: $out"
    weights+=("${line##*weights }")
    # AutoBatch from the installed library: the injected out-of-memory error at step 3 switched
    # both ranks to the smaller micro-batch.
    case "$line" in *"micro-batch 16 x 2, weights"*) ;; *) fail "$name: no micro-batch switch on rank $r: $out" ;; esac
  done
  # Each rank starts from its own seed and trains on its own shard: equal weights at the end
  # mean that DDP broadcast rank 0's parameters and averaged every step's gradients.
  [ "${weights[0]}" = "${weights[1]}" ] || fail "$name: ranks diverged (${weights[*]}): $out"
  [ -s "$T/$name.pt" ] || fail "$name: no checkpoint at $T/$name.pt: $out"
}
run tcpstore
run grpc-store --standalone
step "ran on 2 ranks"

# A program that found torch's own package first (its CMake turns protobuf::libprotobuf into an
# empty stand-in): the package must still link the store client's protobuf.
torch_prefix=$("$SRC/.venv/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
if [ -n "$torch_prefix" ]; then
  echo 'find_package(Torch REQUIRED)' > "$T/find_torch_first.cmake"
  configure "$T/src" "$T/build-torch-first" -DCMAKE_PROJECT_INCLUDE="$T/find_torch_first.cmake" \
            -DCMAKE_PREFIX_PATH="$P;$torch_prefix" || fail "torch first: $(cat "$T/build-torch-first.log")"
  cmake --build "$T/build-torch-first" > "$T/build-torch-first-out.log" 2>&1 \
    || fail "torch first: $(tail -20 "$T/build-torch-first-out.log")"
  step "built after find_package(Torch)"
else
  echo "consumer_test: note: no .venv torch, find_package(Torch)-first case not checked"
fi
echo "consumer_test: ok"
