#!/usr/bin/env bash
# A bfloat16 GRPO run of examples/grpo.lua on the GPU learns: the mean reward
# of its last 20 steps beats that of its first 20. Exit 77 (ctest: skipped)
# where no CUDA device is usable.
# Usage: grpo_cuda.sh RLHOST SOURCE_DIR
set -euo pipefail
rlhost=$1
src=$2
if ! "$rlhost" --version | grep -q "CUDA usable"; then
  echo "SKIPPED: no usable CUDA device ($("$rlhost" --version | tail -n 1))"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$src"
"$rlhost" run examples/grpo.lua --config examples/grpo.yaml \
  --set model.device=cuda --set model.dtype=bfloat16 \
  --set model.init_dir="$work/tiny" --set run.dir="$work/runs" --set run.steps=200 \
  --set run.progress=lines
python3 - "$work/runs/grpo/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rl = [r for r in rows if r.get("phase", "rl") == "rl" and "reward" in r]
if len(rl) < 40:
    sys.exit(f"only {len(rl)} RL steps with a reward in metrics.jsonl")
first = sum(r["reward"] for r in rl[:20]) / 20
last = sum(r["reward"] for r in rl[-20:]) / 20
print(f"mean reward: first 20 steps {first:.3f}, last 20 steps {last:.3f}")
sys.exit(0 if last > first + 0.05 else 1)
PY
