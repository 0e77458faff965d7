#!/usr/bin/env bash
# Out-of-tree plugin: install the SDK into a temp prefix, build the templates
# against it with find_package(rl), drop the .so files into a plugins folder,
# and check that the installed rlhost lists them next to the installed plugins.
# The C++ template is a policy-gradient loss on the installed toolkit headers
# (rl/sdk/pg_loss.hpp) in at most 30 lines; through the installed librl it must
# give -scale * ratio * A aggregated by each loss_agg_mode, as a formula says.
set -euo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
mkdir -p "$tmp/plugins"
for t in cpp_loss c_loss; do
  cp -r "$src/sdk/templates/$t" "$tmp/$t"
  cmake -S "$tmp/$t" -B "$tmp/$t/build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/$t.log" 2>&1 \
    || { cat "$tmp/$t.log"; exit 1; }
  cmake --build "$tmp/$t/build" >> "$tmp/$t.log" 2>&1 || { cat "$tmp/$t.log"; exit 1; }
  cp "$tmp/$t/build/"*.so "$tmp/plugins/"
done
# The installed rlhost: finds its own librl through RUNPATH and the installed
# plugins in <prefix>/lib/rl/plugins, plus the dropped-in ones.
installed="$tmp/prefix/bin/rlhost"
[ -x "$installed" ] || { echo "rlhost was not installed"; exit 1; }
out=$(RL_PLUGIN_PATH="$tmp/plugins" "$installed" plugins)
echo "$out"
grep -q "policy_loss .*$tmp/prefix/.*rl/plugins/rl-loss-policy_loss.so" <<<"$out" \
  || { echo "installed plugins not listed"; exit 1; }
grep -q "my_loss .*$tmp/plugins/my_loss.so" <<<"$out" || { echo "my_loss not listed"; exit 1; }
grep -q "my_c_loss .*$tmp/plugins/my_c_loss.so" <<<"$out" || { echo "my_c_loss not listed"; exit 1; }
echo "out-of-tree plugins listed"

lines=$(wc -l < "$src/sdk/templates/cpp_loss/my_loss.cpp")
[ "$lines" -le 30 ] || { echo "cpp_loss template has $lines lines (> 30)"; exit 1; }
librl=$(ls "$tmp/prefix/lib/"librl.so* 2>/dev/null | head -1)
[ -n "$librl" ] || librl=$(ls "$tmp/prefix/"lib*/librl.so* | head -1)
# Under a sanitizer build the (uninstrumented) interpreter needs the ASan
# runtime preloaded (RL_TEST_PYTHON_PRELOAD, set by CMake then).
LD_PRELOAD="${RL_TEST_PYTHON_PRELOAD:-${LD_PRELOAD:-}}" ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}" \
  PYTHONPATH="$src/sdk/python" RL_LIBRARY="$librl" PYTHONDONTWRITEBYTECODE=1 \
  python3 - "$tmp/plugins" <<'PY'
import math, sys
import rl

lp = [-1.0, -2.0, -0.5, -0.7, -1.5]
old = [-1.1, -2.0, -0.4, -0.9, -1.2]
adv = [1.0, -1.0, 0.5, 2.0, -0.5]
mask = [1.0, 1.0, 0.0, 1.0, 1.0]
cu = [0, 2, 5]
scale = 0.5
l = [-scale * math.exp(a - b) * A for a, b, A in zip(lp, old, adv)]
seqs = [[t for t in range(cu[s], cu[s + 1]) if mask[t]] for s in range(len(cu) - 1)]
tokens = sum(len(s) for s in seqs)
want = {
    "token-mean": sum(l[t] for s in seqs for t in s) / tokens,
    "seq-mean-token-sum": sum(sum(l[t] for t in s) for s in seqs) / len(seqs),
    "seq-mean-token-mean": sum(sum(l[t] for t in s) / len(s) for s in seqs) / len(seqs),
    "seq-mean-token-sum-norm": sum(sum(l[t] for t in s) for s in seqs) / (len(seqs) * 8),
    "sum": sum(l[t] for s in seqs for t in s),
}
with rl.Runtime(plugin_path=sys.argv[1], default_plugins=False, log_level="error") as rt:
    for mode, value in want.items():
        params = {"scale": scale, "loss_agg_mode": mode}
        if mode == "seq-mean-token-sum-norm":
            params["max_seq_len"] = 8
        loss = rt.create("loss", "my_loss", params)
        out = loss.compute({"logprobs": lp, "old_logprobs": old, "advantages": adv,
                            "loss_mask": mask}, cu)
        got = out.scalars["loss"]
        assert abs(got - value) <= 1e-12 * (1 + abs(value)), (mode, got, value)
        assert out.metrics["pg_loss"] == got and out.metrics["valid_tokens"] == tokens, out
        print(f"my_loss {mode}: {got:.12g} == formula {value:.12g}")
PY
echo "out-of-tree loss matches its formula in every aggregation mode"
