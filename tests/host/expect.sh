#!/usr/bin/env bash
# expect.sh RC REGEX CMD...: runs CMD, echoes its output, and passes when CMD
# exits with RC and its output matches the extended REGEX (ctest's
# PASS_REGULAR_EXPRESSION alone would ignore the exit status).
set -u
want_rc=$1
regex=$2
shift 2
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$want_rc" ]; then
    echo "expect.sh: exit status $rc, expected $want_rc" >&2
    exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$regex"; then
    echo "expect.sh: output does not match: $regex" >&2
    exit 1
fi
