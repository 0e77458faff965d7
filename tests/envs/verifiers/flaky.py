#!/usr/bin/env python3
"""A verifier that misbehaves on demand, keyed by the completion text:
"hang" sleeps forever, "crash" exits with status 3, "segv" dies of SIGSEGV,
"garbage" prints a non-JSON line, "wrong-id" answers with another id,
"no-reward" leaves out the reward, "error" answers {"error": ...}, "two-lines"
prints an extra line after its answer, "answer-then-exit" answers and exits; anything else scores 1.0.
Metrics carry the pid so tests can see restarts."""
import json
import os
import signal
import sys
import time

for line in sys.stdin:
    req = json.loads(line)
    c = req.get("completion", "")
    if c == "hang":
        time.sleep(3600)
    elif c == "crash":
        sys.exit(3)
    elif c == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif c == "garbage":
        print("this is not json", flush=True)
    elif c == "wrong-id":
        print(json.dumps({"id": req["id"] + 100, "reward": 1.0}), flush=True)
    elif c == "no-reward":
        print(json.dumps({"id": req["id"], "metrics": {}}), flush=True)
    elif c == "error":
        print(json.dumps({"id": req["id"], "error": "cannot judge this one"}), flush=True)
    elif c == "answer-then-exit":
        print(json.dumps({"id": req["id"], "reward": 0.5}), flush=True)
        sys.exit(0)
    elif c == "two-lines":
        print(json.dumps({"id": req["id"], "reward": 0.25}), flush=True)
        print(json.dumps({"id": req["id"], "reward": 0.75}), flush=True)
    else:
        print(json.dumps({"id": req["id"], "reward": 1.0, "metrics": {"pid": os.getpid()}}),
              flush=True)
