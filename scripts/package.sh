#!/usr/bin/env bash
# `make package`: the Debian package of launch, rdzv-server and the gRPC plugin, by CPack from
# the build tree (cmake/DdplPackage.cmake; stripped, Depends from dpkg-shlibdeps). Result:
# OUT/ddplaunch_<version>_<arch>.deb (OUT: the second argument, default dist/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${1:-build}"; OUT="${2:-dist}"
mkdir -p "$OUT"
rm -rf "$BUILD_DIR/package" && rm -f "$OUT"/ddplaunch_*.deb
cpack --config "$BUILD_DIR/CPackConfig.cmake" -B "$BUILD_DIR/package" > "$BUILD_DIR/package.log" 2>&1 \
  || { cat "$BUILD_DIR/package.log"; exit 1; }
mv "$BUILD_DIR"/package/ddplaunch_*.deb "$OUT"/
deb=$(ls "$OUT"/ddplaunch_*.deb)
echo "package: $deb ($(du -h "$deb" | cut -f1))"
echo "Depends: $(dpkg-deb -f "$deb" Depends)"
