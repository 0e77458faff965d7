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
