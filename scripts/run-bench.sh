#!/usr/bin/env bash
# `make bench`: every benchmark program in the build. Usage: scripts/run-bench.sh BUILD_DIR
set -euo pipefail
build=${1:-build}
shopt -s nullglob
found=0
for b in "$build"/bin/bench_*; do
  found=1
  echo "== $(basename "$b")"
  "$b"
done
[ $found -eq 1 ] || { echo "no benchmarks built (configure with -DRL_BUILD_BENCH=ON)"; exit 1; }
# Side-by-side scripts that print ratios.
for s in "$(dirname "$0")"/../bench/*/compare.sh; do
  echo "== ${s#*/../}"
  bash "$s" "$build"
done
