#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need. Idempotent: a
# package already present is skipped, and nothing is fetched when all are.
# Usage: scripts/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libgloo-dev libopenblas0-pthread
  liblua5.4-dev lua5.4
  libyaml-cpp-dev libboost-dev
  libspdlog-dev libfmt-dev
  libzmq3-dev cppzmq-dev
  nlohmann-json3-dev libdlpack-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy
  libpcre2-dev libutf8proc-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
