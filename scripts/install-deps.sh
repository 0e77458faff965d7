#!/usr/bin/env bash
# Installs what the build and the tests need: Debian packages, and libtorch as
# the pinned PyPI torch wheel in the project venv .venv/ (CMake finds it there;
# see cmake/RlTorch.cmake). Idempotent: a package already present is skipped,
# and nothing is fetched when all are.
# Usage: scripts/install-deps.sh [--tests]   (as root, or with sudo available)
#   --tests                  also what only the tests use (`make test` passes it)
#   RL_TORCH_VERSION=2.x.y   another torch wheel than the pinned one
#   RL_SKIP_TORCH=1          no venv: build against a torch you provide
#                            (-DRL_PYTHON=... or -DCMAKE_PREFIX_PATH=...)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  liblua5.4-dev lua5.4
  libyaml-cpp-dev libboost-dev
  libspdlog-dev libfmt-dev
  libzmq3-dev cppzmq-dev
  nlohmann-json3-dev libdlpack-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-venv python3-numpy
  libpcre2-dev libutf8proc-dev
  libgloo-dev
  clang libclang-rt-14-dev
)

# Only the tests use these: a headless browser that opens the page of
# `rlhost report` (tests/lua/test_grpo_run.py).
test_packages=(chromium-headless-shell)
case "${1:-}" in
  "") ;;
  --tests) packages+=("${test_packages[@]}") ;;
  *) echo "install-deps: unknown argument '$1' (the only one is --tests)" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

install_torch() {
  [ "${RL_SKIP_TORCH:-0}" = 1 ] && return 0
  local root version venv
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  version="${RL_TORCH_VERSION:-2.15.0}"
  venv="$root/.venv"
  if [ -x "$venv/bin/python" ] &&
     [ "$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$version" ]; then
    return 0
  fi
  echo "install-deps: installing torch==$version into $venv"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    "torch==$version"
}

if [ ${#missing[@]} -eq 0 ]; then
  install_torch
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
install_torch
