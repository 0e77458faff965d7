#!/usr/bin/env bash
# rlhost launch: the variables each rank gets, prefixed output, a failing or
# killed rank stopping the others quickly with its status, usage errors.
# Usage: launch_test.sh RLHOST DATA_DIR
set -u
rlhost=$1
data=$2
fail=0
check() { # name rc_want regex rc out
    if [ "$4" -ne "$2" ] || ! printf '%s\n' "$5" | grep -Eq -- "$3"; then
        printf 'FAIL %s: status %s (want %s), output:\n%s\n' "$1" "$4" "$2" "$5"
        fail=1
    else
        echo "ok   $1"
    fi
}

out=$("$rlhost" launch --nproc-per-node 2 -- run "$data/env.lua" 2>&1); rc=$?
check "each rank gets its variables" 0 \
    '\[rank 1\] env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER=127.0.0.1:[0-9]+' "$rc" "$out"
check "output is prefixed by rank" 0 '\[rank 0\] env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0' "$rc" "$out"

out=$("$rlhost" launch --nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 \
    --master-port 1234 -- run "$data/env.lua" 2>&1); rc=$?
check "node rank offsets the global rank" 0 \
    '\[rank 3\] env RANK=3 WORLD_SIZE=4 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER=10.0.0.1:1234' "$rc" "$out"

start=$(date +%s)
out=$("$rlhost" launch --nproc-per-node 2 --grace-seconds 3 -- run "$data/fail.lua" -- exit3 2>&1); rc=$?
took=$(( $(date +%s) - start ))
check "a failing rank's status is the launcher's" 3 'rank 1 exited with status 3; stopping the others' "$rc" "$out"
if [ "$took" -ge 20 ]; then echo "FAIL the sibling was not stopped (took ${took}s)"; fail=1; fi

out=$("$rlhost" launch --nproc-per-node 2 --grace-seconds 3 -- run "$data/fail.lua" -- kill9 2>&1); rc=$?
check "a killed rank gives 128 + signal" 137 'rank 1 killed by signal 9' "$rc" "$out"

out=$("$rlhost" launch -- run "$data/env.lua" 2>&1); rc=$?
check "--nproc-per-node is required" 2 'nproc-per-node \(or --roles\) is required' "$rc" "$out"

out=$(RANK=7 "$rlhost" launch --roles trainer,rollout:2 -- run "$data/env.lua" 2>&1); rc=$?
check "each role gets its name and index, no rank" 0 \
    '\[rollout 1\] role rollout 1/2 RANK=nil' "$rc" "$out"
check "a single role is prefixed by its name" 0 '\[trainer\] role trainer 0/1 RANK=nil' "$rc" "$out"
out=$("$rlhost" launch --roles trainer,rollout:2 --grace-seconds 3 -- run "$data/fail.lua" -- exit3 2>&1); rc=$?
check "a failing role stops the others" 3 'rollout 1 exited with status 3; stopping the others' "$rc" "$out"
out=$("$rlhost" launch --roles Trainer -- run x 2>&1); rc=$?
check "a bad role is named" 2 "--roles: 'Trainer' is not ROLE or ROLE:N" "$rc" "$out"
out=$("$rlhost" launch --roles a,a -- run x 2>&1); rc=$?
check "a role given twice is named" 2 "--roles: 'a' given twice" "$rc" "$out"
out=$("$rlhost" launch --roles a --nproc-per-node 2 -- run x 2>&1); rc=$?
check "roles do not combine with ranks" 2 "does not combine with --nproc-per-node" "$rc" "$out"
out=$("$rlhost" launch --nproc-per-node zero -- run x 2>&1); rc=$?
check "a bad count is named" 2 "--nproc-per-node must be an integer in \[1, 1024\], got 'zero'" "$rc" "$out"
out=$("$rlhost" launch --nproc-per-node 2 2>&1); rc=$?
check "a missing command is named" 2 'no command: give it after --' "$rc" "$out"
out=$("$rlhost" launch --nproc-per-node 1 --nnodes 2 --node-rank 2 --master-addr h -- run x 2>&1); rc=$?
check "a node rank outside the nodes is named" 2 '--node-rank 2 is not below --nnodes 2' "$rc" "$out"
out=$("$rlhost" launch --nproc-per-node 1 --nnodes 2 -- run x 2>&1); rc=$?
check "several nodes need the master address" 2 '--master-addr is required with --nnodes > 1' "$rc" "$out"
exit $fail
