#!/usr/bin/env bash
# Co-located vs disaggregated GRPO on the tiny model: RL steps/s and reward of
# examples/grpo.lua and of examples/grpo_disaggregated.lua (trainer + one
# rollout worker, over the filesystem and over ZeroMQ; then trainer +
# orchestrator + worker, batches over the filesystem / ZeroMQ and weights over
# the filesystem / the nccl transport), same config and seed, and the ratios. Usage: bench/disaggregated/compare.sh BUILD_DIR [STEPS]
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
steps=${2:-30}
src=$(cd "$(dirname "$0")/../.." && pwd)
rlhost="$build/bin/rlhost"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
common=(--config "$src/tests/lua/scripts/grpo_test.yaml" --set "run.steps=$steps"
        --set loss.name=policy_loss --set "loss.params={}")
summary() { # label
  python3 - "$1" <<'PY'
import json, sys
rl = [r for r in map(json.loads, open("runs/grpo_test/metrics.jsonl")) if r["phase"] == "rl"]
t = sum(r["step_time"] for r in rl)
w = [r["reward"] for r in rl]
k = min(5, len(w))
print(f"{sys.argv[1]:<28} {len(rl) / t:6.2f} steps/s  reward first {k} {sum(w[:k]) / k:.3f}  last {k} {sum(w[-k:]) / k:.3f}")
print(len(rl) / t, file=open("rate", "w"))
PY
}
"$rlhost" run "$src/examples/grpo.lua" "${common[@]}" > log 2>&1 || { cat log; exit 1; }
summary "co-located"
base=$(cat rate)
for t in filesystem zmq; do
  rm -rf runs
  "$rlhost" launch --roles trainer,rollout -- run "$src/examples/grpo_disaggregated.lua" "${common[@]}" \
    --set "rollout_transport.type=$t" --set "weight_broadcast.type=$t" > log 2>&1 || { cat log; exit 1; }
  summary "disaggregated ($t)"
  python3 -c "print(f'  ratio to co-located: {$(cat rate) / $base:.2f}x')"
done
# Three roles: rollout worker -> orchestrator -> trainer.
for t in filesystem zmq; do
  rm -rf runs
  w=$t; [ "$t" = zmq ] && w=nccl
  "$rlhost" launch --roles trainer,orchestrator,rollout -- run "$src/examples/grpo_disaggregated.lua" \
    "${common[@]}" --set "rollout_transport.type=$t" --set "weight_broadcast.type=$w" > log 2>&1 \
    || { cat log; exit 1; }
  summary "three roles ($t + $w weights)"
  python3 -c "print(f'  ratio to co-located: {$(cat rate) / $base:.2f}x')"
done
