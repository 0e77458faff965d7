"""rl.dist from Python and Lua: rank and world size, broadcast and all-gather of
values (tensors too in Lua) between two processes, and a single process as a
world of one."""

import json
import os
import subprocess
import sys
import unittest

import rl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from free_port import free_port  # noqa: E402

RLHOST = os.environ.get("RL_TEST_RLHOST")
SOURCE = os.environ.get("RL_TEST_SOURCE_DIR")

PY_RANK = r"""
import json, rl, rl.dist as d
d.init({"timeout": 30})
r = d.rank()
assert d.world_size() == 2
got = d.broadcast({"from": r, "xs": [1, 2.5]} if r == 1 else None, root=1)
assert got == {"from": 1, "xs": [1, 2.5]}, got
assert d.all_gather(r * 7) == [0, 7]
d.barrier()
print("py dist ok", r)
"""


def two_ranks(cmd):
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return [(p.wait(timeout=120), p.stdout.read()) for p in procs]


class DistTest(unittest.TestCase):
    def test_single_process_is_a_world_of_one(self):
        import rl.dist as d
        self.assertEqual((d.rank(), d.world_size(), d.is_main()), (0, 1, True))
        self.assertEqual(d.broadcast({"a": 1}), {"a": 1})
        self.assertEqual(d.all_gather("x"), ["x"])
        d.barrier()

    def test_python_ranks_exchange_values(self):
        for r, (code, out) in enumerate(two_ranks([sys.executable, "-c", PY_RANK])):
            self.assertEqual(code, 0, out)
            self.assertIn(f"py dist ok {r}", out)

    @unittest.skipUnless(RLHOST and SOURCE, "needs rlhost")
    def test_lua_ranks_exchange_values_and_tensors(self):
        script = os.path.join(SOURCE, "tests", "dist", "values.lua")
        for r, (code, out) in enumerate(two_ranks([RLHOST, "run", script])):
            self.assertEqual(code, 0, out)
            self.assertIn(f"lua dist ok {r}", out)

    def test_a_bad_root_is_named(self):
        import rl.dist as d
        with self.assertRaises(rl.Error) as e:
            d.broadcast(1, root=3)
        self.assertIn("root 3 is not a rank", str(e.exception))


if __name__ == "__main__":
    unittest.main()
