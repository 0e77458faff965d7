"""rl.disagg, the three-role protocol from Python (abi/rl/disagg.h): a Python
orchestrator between a Lua rollout worker and a Lua trainer (examples/
grpo_disaggregated.lua under rlhost) trains every step once and the reward rises;
a message of another protocol version is refused naming both versions; a worker
whose orchestrator never answers names it after the timeout; mixture-of-experts
rollouts keep their routing (ids and weights) on the way to the trainer, and a
chunk whose routing is not one row per token is refused naming the tensor."""

import json
import os
import shutil
import subprocess
import tempfile
import threading
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

    def test_a_trainer_hello_cleared_by_a_starting_orchestrator_is_said_again(self):
        # rlhost launch starts the roles together: the orchestrator clears its folders
        # on start, and a hello the trainer wrote just before was gone for good (the run
        # then stopped after the timeout, the orchestrator never having heard of it).
        end = dg.TrainerEnd(self.rt, {"transport": "filesystem", "dir": self.dir,
                                      "timeout": 20})
        end.hello(0)
        shutil.rmtree(os.path.join(self.dir, "to_orch_trainer"))  # what the start clears
        orch_in = self.rt.create("transport", "filesystem",
                                 {"dir": self.dir, "channel": "to_orch_trainer", "poll_ms": 10})
        orch_out = self.rt.create("transport", "filesystem",
                                  {"dir": self.dir, "channel": "batches", "poll_ms": 10})
        got = {}
        waiter = threading.Thread(target=lambda: got.update(next=end.next(0)))
        waiter.start()
        msg = orch_in.recv(6000)
        self.assertIsNotNone(msg, "the trainer did not say hello again")
        self.assertEqual((msg[0]["kind"], msg[0]["hello"], msg[0]["version"]),
                         ("rl.trainer", True, 0), msg[0])
        # The orchestrator's answer, then the batch: no more hellos once heard.
        protocol = {"protocol": dg.PROTOCOL_VERSION}
        orch_out.send(dict(protocol, kind="rl.orchestrator_hello", welcome=True))
        orch_out.send(dict(protocol, kind="rl.batch", step=0))
        waiter.join(30)
        self.assertEqual(got["next"][0]["kind"], "rl.batch")
        while orch_in.recv(0) is not None:  # said before it read the answer (a slow machine)
            pass
        self.assertIsNone(orch_in.recv(2500), "a hello after the orchestrator answered")
        end.close()

    def test_closing_the_runtime_or_an_end_while_its_call_waits_is_refused_naming_it(self):
        # The waits run without the GIL: before, closing from another thread freed the
        # runtime under them and the process crashed.
        config = {"transport": "filesystem", "dir": self.dir, "timeout": 3, "workers": 1,
                  "steps": 1, "min_rollouts": 4, "state_dir": os.path.join(self.dir, "state")}
        w = dg.Worker(self.rt, dict(config, dir=os.path.join(self.dir, "w")), 0)
        advantage = self.rt.create("advantage", "grpo")
        errors = {}

        def wait(name, fn):
            try:
                fn()
            except rl.Error as e:
                errors[name] = str(e)

        threads = [threading.Thread(target=wait, args=("credit", w.credit)),
                   threading.Thread(target=wait, args=("orchestrate", lambda: dg.orchestrate(
                       self.rt, config, rl.Buffer({"group_size": 4}), advantage)))]
        for t in threads:
            t.start()
        deadline = time.time() + 10
        while len(self.rt._running) < 2 and time.time() < deadline:
            time.sleep(0.01)
        with self.assertRaises(rl.Error) as e:
            self.rt.close()
        self.assertEqual(e.exception.status, "RL_ERR_BAD_STATE")
        self.assertIn("rl.Runtime.close: rl.disagg.Worker.credit, rl.disagg.orchestrate is still "
                      "running in another thread", str(e.exception))
        with self.assertRaises(rl.Error) as e:
            w.close()
        self.assertIn("rl.disagg.Worker.close: rl.disagg.Worker.credit is still running",
                      str(e.exception))
        with self.assertRaises(rl.Error) as e:  # the orchestrator calls it
            advantage.close()
        self.assertIn("advantage 'grpo'.close: rl.disagg.orchestrate is still running",
                      str(e.exception))
        for t in threads:
            t.join(60)
        # Both waits ended by their timeout, the runtime untouched; now it closes, and
        # closes the worker's end with it.
        self.assertIn("no credit from the orchestrator", errors.get("credit", ""), errors)
        self.assertIn("orchestrate", errors)
        self.rt.close()
        with self.assertRaises(rl.Error) as e:
            w.credit()
        self.assertIn("rl.Runtime is closed", str(e.exception))

    def test_closing_a_transport_while_it_waits_in_recv_is_refused_naming_the_call(self):
        box = self.rt.create("transport", "filesystem",
                             {"dir": self.dir, "channel": "quiet", "poll_ms": 10})
        got = {}
        waiter = threading.Thread(target=lambda: got.update(msg=box.recv(3000)))
        waiter.start()
        deadline = time.time() + 10
        while not self.rt._running and time.time() < deadline:
            time.sleep(0.01)
        for close, name in ((self.rt.close, "rl.Runtime.close"),
                            (box.close, "transport 'filesystem'.close")):
            with self.assertRaises(rl.Error) as e:
                close()
            self.assertIn(f"{name}: transport 'filesystem'.recv is still running in another "
                          "thread", str(e.exception))
        waiter.join(30)
        self.assertIsNone(got["msg"])  # its timeout, on a runtime left alone
        box.close()
        with self.assertRaises(rl.Error) as e:
            box.recv(0)
        self.assertIn("transport 'filesystem' is closed", str(e.exception))

    def test_a_chunk_whose_routing_is_not_token_rows_is_refused_naming_the_tensor(self):
        config = {"transport": "filesystem", "dir": self.dir, "timeout": 30, "workers": 1,
                  "steps": 1, "checkpoint_every": 0, "min_rollouts": 1}
        failure = []

        def orchestrator():
            try:
                dg.orchestrate(self.rt, config, rl.Buffer({"group_size": 1}),
                               self.rt.create("advantage", "grpo"))
            except rl.Error as e:
                failure.append(e)

        thread = threading.Thread(target=orchestrator, daemon=True)
        thread.start()
        worker = self.rt.create("transport", "filesystem",
                                {"dir": self.dir, "channel": "to_orch_w0", "poll_ms": 10})
        # Four tokens whose routing is a flat list, not [tokens, layers, k] rows.
        # Sent again each second until the orchestrator stops: it clears its
        # folders when it starts (a send can fail then, or be swept away), and a
        # chunk it took once is a duplicate after that.
        try:
            for _ in range(60):
                try:
                    worker.send({"kind": "rl.rollouts", "worker": 0, "worker_run": "hand-made",
                                 "seq": 1, "policy_version": 0, "protocol": dg.PROTOCOL_VERSION},
                                {"input_ids": [5, 6, 7, 8], "cu_seqlens": [0, 4],
                                 "loss_mask": [0, 1, 1, 1], "rewards": [1.0], "group_ids": [0],
                                 "policy_versions": [0.0],
                                 "routed_experts": [1.0, 2.0, 3.0, 4.0]})
                except rl.Error:
                    pass
                thread.join(1)
                if not thread.is_alive():
                    break
        finally:
            thread.join(60)  # never close the runtime under a running orchestrator
        self.assertFalse(thread.is_alive(), "the orchestrator did not stop")
        self.assertEqual(len(failure), 1)
        self.assertIn("chunk 1 of worker 0: tensor 'routed_experts' must be [4 tokens, sparse "
                      "layers, experts per token]", str(failure[0]))

    def test_a_bad_config_key_is_named(self):
        with self.assertRaises(rl.Error) as e:
            dg.TrainerEnd(self.rt, {"transport": "zmq", "port": 5555, "workerz": 2})
        self.assertIn("unknown config key 'workerz'", str(e.exception))
        with self.assertRaises(rl.Error) as e:
            dg.Worker(self.rt, {"transport": "zmq", "port": 5555, "workers": 2}, 2)
        self.assertIn("worker 2, but there are 2", str(e.exception))


class RoutingThroughTheOrchestratorTest(unittest.TestCase):
    """R3 in the disaggregated mode: a chunk of mixture-of-experts rollouts that
    recorded their routing (ids and weights) reaches the trainer's batch with
    every sequence's rows intact, through a real orchestrator (in a thread)."""

    def test_the_trainers_batch_carries_each_sequences_routing_and_weights(self):
        work = tempfile.mkdtemp(prefix="rl_disagg_r3_")
        self.addCleanup(shutil.rmtree, work, True)
        rt = rl.Runtime(plugin_path=PLUGINS, log_level="warn")
        self.addCleanup(rt.close)
        rl.init_model("tiny-moe", os.path.join(work, "moe"), 3)
        env = rt.create("env", "reverse_text")
        sampling = {"n": 2, "max_tokens": 5, "seed": 4, "return_routed_experts": True,
                    "return_expert_logits": True}
        config = {"transport": "filesystem", "dir": os.path.join(work, "transport"),
                  "timeout": 60, "workers": 1, "steps": 1, "checkpoint_every": 0,
                  "max_async_level": 1, "min_rollouts": 4}

        def sequences(tensors):
            """(tokens, expert ids, weights) of every packed sequence, sorted."""
            ids, cu = tensors["input_ids"], tensors["cu_seqlens"]
            routes, weights = tensors["routed_experts"], tensors["routed_expert_weights"]
            row = len(routes) // len(ids)
            return sorted((tuple(ids[a:b]), tuple(routes[a * row:b * row]),
                           tuple(weights[a * row:b * row])) for a, b in zip(cu, cu[1:]))

        stats, failure = {}, []

        def orchestrator():
            try:
                stats.update(dg.orchestrate(rt, config, rl.Buffer({"group_size": 2}),
                                            rt.create("advantage", "grpo")))
            except rl.Error as e:
                failure.append(e)

        thread = threading.Thread(target=orchestrator, daemon=True)
        thread.start()
        # Cleanups run last-in first-out: the orchestrator ends (or times out)
        # before the runtime it runs on is closed, even when the test fails.
        self.addCleanup(thread.join, 90)
        with rl.Model(os.path.join(work, "moe"), {"threads": 1}) as model, \
                model.engine() as engine:
            worker, trainer = dg.Worker(rt, config, 0), dg.TrainerEnd(rt, config)
            trainer.hello(0)
            worker.hello()
            self.assertFalse(worker.credit()["done"])
            with engine.rollouts(env.sample(2, 5), sampling=sampling) as ro:
                ro.set_rewards([1.0, 0.0, 0.0, 1.0])
                with ro.to_batch() as local:
                    want = sequences(local.info().tensors)
                worker.send(ro, 0)
            header, tensors = trainer.next(0)
            while header["kind"] == "rl.weights_wanted":
                header, tensors = trainer.next(0)
            self.assertEqual(header["kind"], "rl.batch")
            self.assertEqual(sequences(tensors), want)
            trainer.ack(1)
            thread.join(60)
            worker.close()
            trainer.close()
        self.assertFalse(failure, failure)
        self.assertEqual(stats["batches"], 1)


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
