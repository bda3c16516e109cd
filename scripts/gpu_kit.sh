#!/usr/bin/env bash
# `make gpu-kit`: gathers, on this machine, what a bare GPU host lacks to build and run the GPU
# checks (tests/gpu/run_gpu_checks.sh, docs/gpu.md): the Debian packages of the headers the
# worker library, the example and `launch` need, as .deb files fetched with `apt-get download`
# (never installed here). On the GPU host they are unpacked with `dpkg -x` into a private
# prefix under /tmp, never into /. gpu-kit/ is git-ignored; `device` carries it with the tree.
#
# What is in it, and why each:
#   libspdlog-dev libfmt-dev   logging, built header-only there (DDPL_HEADER_ONLY_LOGGING)
#   libspdlog1.10 libfmt9      only so that their CMake configs find the files they name
#   nlohmann-json3-dev         the launcher's error files and reports (header-only)
#   libgloo-dev                the headers ProcessGroupGloo.hpp includes (never linked)
#   libdw-dev libelf-dev       the worker library's symboliser of error-file frames (elfutils)
#   libdw1 libelf1             ... and the libraries it loads at run time
# Not needed there: gRPC and protobuf (DDPL_WITH_GRPC=OFF: workers bootstrap through the
# TCPStore, as under torchrun), OpenMPI (the MPI bootstrap is skipped), GoogleTest (only the
# check programs are built), prometheus-cpp (no --metrics-port there).
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=gpu-kit
PKGS=(libspdlog-dev libfmt-dev libspdlog1.10 libfmt9 nlohmann-json3-dev libgloo-dev
      libdw-dev libelf-dev libdw1 libelf1)
mkdir -p "$KIT/debs"
have=1
for p in "${PKGS[@]}"; do
  ls "$KIT/debs/${p}_"*.deb >/dev/null 2>&1 || have=0
done
if [ "$have" = 0 ]; then
  echo "gpu-kit: fetching ${PKGS[*]}"
  (cd "$KIT/debs" && apt-get download "${PKGS[@]}" 2>&1 >/dev/null | grep -v "^W: Download is performed unsandboxed" >&2 || true)
fi
# What the host needs to know about the kit: the packages and the Debian release they come from.
{
  echo "# made by scripts/gpu_kit.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(. /etc/os-release; echo "$PRETTY_NAME")"
  (cd "$KIT/debs" && ls -1 *.deb)
} > "$KIT/MANIFEST"
size=$(du -sk "$KIT" | cut -f1)
echo "gpu-kit: $KIT/ holds $(ls "$KIT/debs" | wc -l) packages, ${size} KiB (limit 50 MiB)"
if [ "$size" -gt $((50 * 1024)) ]; then
  echo "gpu-kit: too large for the trip to the GPU host" >&2
  exit 1
fi
