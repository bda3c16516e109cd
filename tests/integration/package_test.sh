#!/usr/bin/env bash
# `make package`'s Debian package, built from this build tree by CPack: exactly launch,
# rdzv-server and the gRPC plugin under /usr (no LibTorch, no worker library), Depends on the
# Debian runtime libraries they link, and, unpacked anywhere, a launch that finds its plugin.
# Usage: package_test.sh BUILD_DIR
set -euo pipefail
BUILD="$1"
for tool in cpack dpkg-deb dpkg-shlibdeps file; do
  if ! command -v "$tool" >/dev/null; then
    echo "package_test: skipped: no $tool here (make setup installs dpkg-dev and file)"
    exit 77
  fi
done
T=$(mktemp -d /tmp/ddpl-package-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "package_test: FAIL: $*" >&2; exit 1; }

cpack --config "$BUILD/CPackConfig.cmake" -B "$T/out" > "$T/cpack.log" 2>&1 || fail "cpack: $(cat "$T/cpack.log")"
debs=("$T"/out/*.deb)
[ ${#debs[@]} = 1 ] && [ -f "${debs[0]}" ] || fail "expected one .deb, got: ${debs[*]}"
deb="${debs[0]}"
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$BUILD/CMakeCache.txt")
[ "$(basename "$deb")" = "ddplaunch_${version}_amd64.deb" ] || [ "$(dpkg --print-architecture)" != amd64 ] \
  || fail "package file name $(basename "$deb")"

files=$(dpkg-deb -c "$deb" | grep -v '^d' | awk '{print $6}' | sort | tr '\n' ' ')
expected="./usr/bin/launch ./usr/bin/rdzv-server ./usr/lib/libddpl_launch_grpc.so ./usr/lib/libddpl_launch_metrics.so "
[ "$files" = "$expected" ] || fail "package holds [$files], expected [$expected]"

[ "$(dpkg-deb -f "$deb" Package)" = ddplaunch ] || fail "package name $(dpkg-deb -f "$deb" Package)"
[ "$(dpkg-deb -f "$deb" Version)" = "$version" ] || fail "version $(dpkg-deb -f "$deb" Version), not $version"
depends=$(dpkg-deb -f "$deb" Depends)
for lib in libc6 'libgrpc++' libprotobuf libspdlog libfmt libprometheus-cpp-pull; do
  echo "$depends" | grep -q "$lib" || fail "Depends lacks $lib: $depends"
done
if echo "$depends" | grep -qi torch; then fail "Depends names torch: $depends"; fi

# Unpacked at a place of its own: launch finds the plugin next to it (--standalone loads it).
dpkg-deb -x "$deb" "$T/root"
"$T/root/usr/bin/launch" --version | grep -q "$version" || fail "launch --version: $("$T/root/usr/bin/launch" --version)"
out=$("$T/root/usr/bin/launch" --standalone --nproc-per-node 1 /bin/true 2>&1) || fail "launch from the package: $out"
"$T/root/usr/bin/rdzv-server" --help | grep -q "usage: rdzv-server" || fail "rdzv-server --help"
echo "package_test: ok ($(basename "$deb"), $(du -h "$deb" | cut -f1); Depends: $depends)"
