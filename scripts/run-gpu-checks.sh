#!/usr/bin/env bash
# The checks of a GPU machine in one go, for binaries built elsewhere against
# that machine's own torch (docs/building.md, "On a borrowed GPU machine"):
# the `cuda` tests, then the side-by-side benchmark with and without the fused
# kernels, then (with --profile) where our GPU time goes. Logs go to $OUT (or
# /tmp/gpu-checks).
# Usage: scripts/run-gpu-checks.sh DIR [--profile]   (DIR/bin, DIR/lib)
set -uo pipefail
dir=$(cd "$1" && pwd)
profile=${2:-}
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out=${OUT:-/tmp/gpu-checks}
mkdir -p "$out"
torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$dir/lib:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
echo "== cuda tests"
timeout 300 "$dir/bin/platform_cuda_test" >"$out/cuda_test.log" 2>&1
echo "platform_cuda_test exit $?"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|^\[  PASSED|Failure|Expected|Which is|actual|Trace|\.cpp:[0-9]+|bfloat16 engine" \
  "$out/cuda_test.log" | head -80
echo "== side by side"
timeout 420 python3 "$root/bench/compare/compare.py" "$dir/bin/bench_train_decode" --device cuda \
  --unfused-too 2>&1 | tee "$out/compare.log"
if [ "$profile" = --profile ]; then
  echo "== profile"
  timeout 300 python3 "$root/bench/compare/compare.py" "$dir/bin/bench_train_decode" \
    --device cuda --profile >"$out/profile.log" 2>&1
  echo "profile exit $?"
  tail -n 60 "$out/profile.log"
fi
