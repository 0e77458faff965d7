#!/usr/bin/env bash
# `make run`: the default example. Usage: scripts/run-example.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
"$build/bin/rlhost" --version
"$build/bin/rlhost" plugins
