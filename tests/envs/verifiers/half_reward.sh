#!/bin/sh
# A verifier in POSIX sh: every completion gets reward 0.5. It echoes the
# request's "id" (the host puts it first in the JSON object it sends).
while IFS= read -r line; do
  id=$(printf '%s\n' "$line" | sed -n 's/^{"id":\([0-9]*\).*/\1/p')
  printf '{"id": %s, "reward": 0.5, "metrics": {"from_sh": 1}}\n' "$id"
done
