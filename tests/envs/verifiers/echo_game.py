#!/usr/bin/env python3
"""A multi-turn env for the `command` env's step protocol: every assistant turn
earns 0.25 and is answered with "again\\n" until the third turn, which ends the
episode. The task's metadata picks a misbehaviour at turn `at` (0-based):
"crash" exits, "hang" sleeps past any timeout; "turn_rewards" (a list of
three numbers) replaces the 0.25 of each turn. Metrics carry the pid."""
import json
import os
import sys
import time

for line in sys.stdin:
    req = json.loads(line)
    if req["method"] != "step":
        print(json.dumps({"id": req["id"], "error": "this env only steps"}), flush=True)
        continue
    meta = req["task"].get("metadata") or {}
    turn = (req["state"] or {}).get("turn", 0)
    if meta.get("at") == turn and meta.get("misbehave") == "crash":
        sys.exit(3)
    if meta.get("at") == turn and meta.get("misbehave") == "hang":
        time.sleep(3600)
    reward = meta["turn_rewards"][turn] if "turn_rewards" in meta else 0.25
    out = {"id": req["id"], "reward": reward, "metrics": {"pid": os.getpid(), "turn": turn}}
    if turn >= 2:
        out["done"] = True
    else:
        out.update(done=False, observation="again\n", state={"turn": turn + 1})
    print(json.dumps(out), flush=True)
