"""rl.disagg, the three-role protocol from Python (abi/rl/disagg.h): a Python
orchestrator between a Lua rollout worker and a Lua trainer (examples/
grpo_disaggregated.lua under rlhost) trains every step once and the reward rises;
a message of another protocol version is refused naming both versions; a worker
whose orchestrator never answers names it after the timeout."""

import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

import rl
import rl.disagg as dg

RLHOST = os.environ.get("RL_TEST_RLHOST")
SOURCE = os.environ.get("RL_TEST_SOURCE_DIR")
PLUGINS = os.environ.get("RL_TEST_PLUGIN_DIR")


class ProtocolTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="rl_disagg_")
        self.rt = rl.Runtime(plugin_path=PLUGINS, log_level="warn")

    def tearDown(self):
        self.rt.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_a_message_of_another_protocol_version_is_refused_naming_both(self):
        self.assertEqual(dg.protocol_version(), dg.PROTOCOL_VERSION)
        end = dg.TrainerEnd(self.rt, {"transport": "filesystem", "dir": self.dir, "timeout": 5})
        peer = self.rt.create("transport", "filesystem",
                              {"dir": self.dir, "channel": "batches", "poll_ms": 10})
        peer.send({"kind": "rl.batch", "step": 0, "protocol": dg.PROTOCOL_VERSION + 98})
        with self.assertRaises(rl.Error) as e:
            end.next(0)
        msg = str(e.exception)
        self.assertIn("'rl.batch' message of the orchestrator speaks protocol version 99", msg)
        self.assertIn(f"this side version {dg.PROTOCOL_VERSION}", msg)
        end.close()

    def test_a_worker_whose_orchestrator_never_answers_names_it_after_the_timeout(self):
        w = dg.Worker(self.rt, {"transport": "filesystem", "dir": self.dir, "timeout": 1,
                                "timeout_name": "rollout_transport.timeout"}, 0)
        w.hello()
        with self.assertRaises(rl.Error) as e:
            w.credit()
        self.assertEqual(e.exception.status, "RL_ERR_TIMEOUT")
        self.assertIn("[rollout 0/1] no credit from the orchestrator within "
                      "rollout_transport.timeout (1s); is it running?", str(e.exception))
        w.close()

    def test_a_bad_config_key_is_named(self):
        with self.assertRaises(rl.Error) as e:
            dg.TrainerEnd(self.rt, {"transport": "zmq", "port": 5555, "workerz": 2})
        self.assertIn("unknown config key 'workerz'", str(e.exception))
        with self.assertRaises(rl.Error) as e:
            dg.Worker(self.rt, {"transport": "zmq", "port": 5555, "workers": 2}, 2)
        self.assertIn("worker 2, but there are 2", str(e.exception))


@unittest.skipUnless(RLHOST and SOURCE and PLUGINS, "needs rlhost, the sources and the plugins")
class PythonOrchestratorTest(unittest.TestCase):
    def test_a_python_orchestrator_between_lua_roles_trains_every_step_once_and_learns(self):
        work = tempfile.mkdtemp(prefix="rl_disagg_run_")
        self.addCleanup(shutil.rmtree, work, True)
        transport = os.path.join(work, "transport")
        yaml = os.path.join(SOURCE, "tests", "lua", "scripts", "grpo_test.yaml")
        overrides = ["rollout_transport.type=filesystem", "weight_broadcast.type=filesystem",
                     "rollout_transport.dir=" + transport, "rollout_transport.timeout=120",
                     "weight_broadcast.timeout=120", "loss.name=policy_loss", "loss.params={}"]
        script = os.path.join(SOURCE, "examples", "grpo_disaggregated.lua")
        procs = {}
        for role in ("trainer", "rollout"):
            args = [RLHOST, "--plugin-path", PLUGINS, "run", script, "--config", yaml]
            for o in overrides + ["orchestrator=true", "role=" + role]:
                args += ["--set", o]
            log = open(os.path.join(work, role + ".log"), "w")
            self.addCleanup(log.close)
            procs[role] = subprocess.Popen(args, cwd=work, stdout=log, stderr=subprocess.STDOUT)

        def read(name):
            with open(os.path.join(work, name)) as f:
                return f.read()

        def logs():
            return "".join(f"---- {r}\n" + read(r + ".log")[-4000:] for r in procs)

        def stop():
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
        self.addCleanup(stop)

        # The orchestrator role, here: the run's own settings, as the Lua roles read them.
        cfg = rl.config_load(yaml, overrides)
        buffer_cfg = {k: v for k, v in cfg["buffer"].items() if k != "min_rollouts"}
        buffer_cfg["group_size"] = cfg["rollout"]["n"]
        rt = rl.Runtime(plugin_path=PLUGINS, log_level="warn")
        self.addCleanup(rt.close)
        advantage = rt.create("advantage", cfg["advantage"]["name"], cfg["advantage"]["params"])
        t = cfg["rollout_transport"]
        config = {"transport": "filesystem", "dir": transport, "timeout": t["timeout"],
                  "timeout_name": "rollout_transport.timeout", "workers": 1,
                  "steps": cfg["run"]["steps"], "checkpoint_every": cfg["run"]["checkpoint_every"],
                  "max_async_level": cfg["max_async_level"],
                  "min_rollouts": cfg["buffer"]["min_rollouts"]}
        try:
            stats = dg.orchestrate(rt, config, rl.Buffer(buffer_cfg), advantage)
        except rl.Error as e:
            self.fail(f"{e}\n{logs()}")
        deadline = time.time() + 120
        for role, p in procs.items():
            code = p.wait(timeout=max(1, deadline - time.time()))
            self.assertEqual(code, 0, f"{role} exited with {code}\n{logs()}")

        steps = cfg["run"]["steps"]
        self.assertEqual(stats["batches"], steps, logs())
        self.assertEqual(stats["lost_chunks"], 0, logs())
        self.assertGreaterEqual(stats["chunks"], steps, logs())
        with open(os.path.join(work, "runs", "grpo_test", "metrics.jsonl")) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        rl_lines = [x for x in lines if x.get("phase") == "rl"]
        # Every step trained once, each on the batch made for it (step s + 1 trains batch s).
        self.assertEqual([x["step"] for x in rl_lines], list(range(1, steps + 1)), logs())
        self.assertEqual([x["batch_step"] for x in rl_lines], list(range(steps)), logs())
        self.assertEqual(rl_lines[-1]["duplicate_batches"], 0)
        first = sum(x["reward"] for x in rl_lines[:5]) / 5
        late = rl_lines[steps // 2:]
        late = sum(x["reward"] for x in late) / len(late)
        self.assertGreater(late, first + 0.15, f"reward: first 5 steps {first}, second half {late}")
        self.assertIn("finished 'grpo_test'", read("trainer.log"))


if __name__ == "__main__":
    unittest.main()
