#!/usr/bin/env bash
# Every binary that links libtorch, directly or through librl / librl_core,
# names the C++ runtime before it among its needed libraries, so std::
# symbols resolve to libstdc++ even where a libtorch exports its own copies
# (torch 2.11's libtorch.so exports a std::filesystem whose remove_all jumps
# to address 0).
# Usage: cxx_runtime_first.sh BINARY...
set -euo pipefail
status=0
for f in "$@"; do
  needed=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  cxx=$(grep -n '^libstdc++' <<<"$needed" | head -1 | cut -d: -f1)
  torch=$(grep -n -E '^lib(torch|c10|rl[._])' <<<"$needed" | head -1 | cut -d: -f1)
  if [ -z "$torch" ]; then
    echo "FAIL: $f does not link libtorch (test list out of date)"; status=1
  elif [ -z "$cxx" ] || [ "$cxx" -gt "$torch" ]; then
    echo "FAIL: $f lists $(sed -n "${torch}p" <<<"$needed") before libstdc++ (needed: $(tr '\n' ' ' <<<"$needed"))"
    status=1
  else
    echo "ok: $(basename "$f"): libstdc++ at $cxx, $(sed -n "${torch}p" <<<"$needed") at $torch"
  fi
done
exit $status
