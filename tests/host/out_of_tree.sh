#!/usr/bin/env bash
# Out-of-tree plugin: install the SDK into a temp prefix, build the templates
# against it with find_package(rl), drop the .so files into a plugins folder,
# and check that the installed rlhost lists them next to the installed plugins.
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

# The template loss (23 lines on the SDK's loss toolkit) supports every
# aggregation mode of the toolkit: two of them against their formulas.
cat > "$tmp/check.lua" <<'LUA'
local rl = require("rl")
local lp, adv = { -1.0, -2.0, -0.5, -1.5, -3.0 }, { 1.0, -1.0, 2.0, 0.5, -0.25 }
local function loss(mode)
    local l = rl.loss("my_loss", { loss_agg_mode = mode, scale = 2.0 })
    return l:compute { logprobs = lp, advantages = adv, cu_seqlens = { 0, 2, 5 } }.loss
end
local s1 = adv[1] * lp[1] + adv[2] * lp[2]
local s2 = adv[3] * lp[3] + adv[4] * lp[4] + adv[5] * lp[5]
local want = { ["token-mean"] = -2 * (s1 + s2) / 5, ["seq-mean-token-mean"] = -2 * (s1 / 2 + s2 / 3) / 2,
    ["seq-mean-token-sum"] = -2 * (s1 + s2) / 2 }
for mode, w in pairs(want) do
    local got = loss(mode)
    assert(math.abs(got - w) <= 1e-6 * math.abs(w), ("%s: got %.9g, want %.9g"):format(mode, got, w))
end
print("my_loss: aggregation modes match their formulas")
LUA
RL_PLUGIN_PATH="$tmp/plugins" "$installed" run "$tmp/check.lua"
lines=$(wc -l < "$src/sdk/templates/cpp_loss/my_loss.cpp")
[ "$lines" -le 30 ] || { echo "the template loss has $lines lines (more than 30)"; exit 1; }
