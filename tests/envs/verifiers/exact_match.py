#!/usr/bin/env python3
"""A well-behaved verifier for the `command` env (tests/envs).

score: reward 1.0 when the stripped completion equals task["answer"], else
0.0; metrics: the completion length and this process's pid (so tests can
tell a restarted verifier from the same one).
sample: n deterministic "say <word>" tasks from the seed.
"""
import json
import os
import sys

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf"]


def handle(req):
    method = req.get("method")
    if method == "score":
        task, completion = req["task"], req["completion"]
        reward = 1.0 if completion.strip() == task.get("answer") else 0.0
        return {"reward": reward,
                "metrics": {"completion_chars": len(completion), "pid": os.getpid()}}
    if method == "sample":
        n, seed = req["n"], req["seed"]
        tasks = []
        for i in range(n):
            word = WORDS[(seed * 31 + i * 7) % len(WORDS)]
            tasks.append({"prompt": "say " + word, "answer": word, "metadata": {"i": i}})
        return {"tasks": tasks}
    return {"error": "unknown method %r" % method}


for line in sys.stdin:  # ends at EOF: the host closed our stdin
    req = json.loads(line)
    resp = handle(req)
    resp["id"] = req["id"]
    print(json.dumps(resp), flush=True)  # flush: one answer per request, now
