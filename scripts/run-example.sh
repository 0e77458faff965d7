#!/usr/bin/env bash
# `make run`: SFT warm-up then GRPO on reverse_text with the built-in tiny model
# (created in models/tiny on first use). Usage: scripts/run-example.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
# OpenMP threads that spin while waiting steal the cores of a small machine.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
"$build/bin/rlhost" --version
exec "$build/bin/rlhost" run examples/grpo.lua --config examples/grpo.yaml
