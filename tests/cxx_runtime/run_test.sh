#!/usr/bin/env bash
# Issue 45: the worker library links on a toolchain whose C++ runtime is static, as the lent GPU
# host's is, with one C++ runtime in the process (LibTorch's shared libstdc++.so.6) and the
# throw-site capture working. Two ways to ask for the static runtime, each built and run:
#   static-flag       -static-libstdc++ -static-libgcc in CMAKE_EXE_LINKER_FLAGS
#   static-toolchain  a compiler that has only libstdc++.a (scripts/static_only_cxx.sh)
# Before the fix both failed to link: "multiple definition of `__cxa_allocate_exception`".
#   bash tests/cxx_runtime/run_test.sh SOURCE_DIR WORK_DIR PYTHON
set -euo pipefail
SRC=${1:?source dir}; WORK=${2:?work dir}; PY=${3:?python with torch}
TORCH_DIR=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
rm -rf "$WORK" && mkdir -p "$WORK"
static_cxx=$(bash "$SRC/scripts/static_only_cxx.sh" "$WORK/static-only-toolchain")
fail=0
for mode in static-flag static-toolchain; do
  b="$WORK/$mode"
  args=(-S "$SRC/tests/cxx_runtime" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
        -DDDPL_SOURCE_DIR="$SRC" -DDDPL_TORCH_DIR="$TORCH_DIR")
  if [ "$mode" = static-flag ]; then
    args+=("-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc")
    cxx=${CXX:-c++}
  else
    cxx=$static_cxx
  fi
  echo "== $mode (CXX=$cxx)"
  if ! CXX=$cxx cmake "${args[@]}" > "$b.configure.log" 2>&1; then
    cat "$b.configure.log"; echo "FAIL $mode: configure"; fail=1; continue
  fi
  if ! cmake --build "$b" > "$b.build.log" 2>&1; then
    grep -E "error|multiple definition" "$b.build.log" | head -n 5
    echo "FAIL $mode: does not link"; fail=1; continue
  fi
  out=$("$b/cxx_runtime_check")
  echo "$out"
  get() { sed -n "s/^$1=//p" <<< "$out"; }
  [ "$(get recorded)" = 1 ] || { echo "FAIL $mode: the throw-site capture is off"; fail=1; }
  [ "$(get frames_torch)" -ge 2 ] || { echo "FAIL $mode: no throw site recorded for a throw inside LibTorch"; fail=1; }
  [ "$(get frames_here)" -ge 2 ] || { echo "FAIL $mode: no throw site recorded for a throw in the program"; fail=1; }
  [ "$(get libstdcxx_mapped)" = 1 ] || { echo "FAIL $mode: $(get libstdcxx_mapped) libstdc++ mapped, expected LibTorch's alone"; fail=1; }
  # A static runtime copy would define the runtime's own entry points in the program itself.
  if nm --defined-only "$b/cxx_runtime_check" | grep -qwE "__cxa_throw|__cxa_begin_catch"; then
    echo "FAIL $mode: the program carries a static copy of the C++ runtime"; fail=1
  fi
done
[ "$fail" = 0 ] && echo "one C++ runtime (LibTorch's) and throw sites recorded, with a static runtime asked for both ways"
exit "$fail"
