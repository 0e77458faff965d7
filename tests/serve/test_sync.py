"""`rlhost serve` driven end to end by the trainer-side client: a server
process on one tiny model, weights of another tiny model synced into it from
Python (distributed over Gloo, and from disk) and from a Lua script under
`rlhost run`; the server's greedy tokens then equal the new model's own."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import rl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from free_port import free_port  # noqa: E402

RLHOST = os.environ["RL_TEST_RLHOST"]
SOURCE = os.environ["RL_TEST_SOURCE_DIR"]
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
PROMPT = [104, 101, 108, 108, 111, 10]


def greedy(model):
    with model.engine() as engine:
        res = engine.generate([PROMPT], {"temperature": 0, "max_tokens": 12, "stop_token_ids": []})
    return res.tensors["token_ids"]


class ServerProcess:
    def __init__(self, model_dir, log, extra=()):
        self.log = open(log, "w")
        self.proc = subprocess.Popen([RLHOST, "serve", "--model", model_dir, "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        deadline = time.time() + 120
        self.url = None
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if self.url is None:
            self.stop()
            with open(log) as f:
                raise AssertionError("rlhost serve did not report its address; log: " +
                                     f.read()[-2000:])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.log.close()
        return self.proc.returncode


class InferenceSync(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="rl-serve-sync-")
        cls.a = os.path.join(cls.tmp, "a")
        cls.b = os.path.join(cls.tmp, "b")
        rl.init_model("tiny", cls.a, 7)
        rl.init_model("tiny", cls.b, 8)
        with rl.Model(cls.a) as m:
            cls.want_a = greedy(m)
        with rl.Model(cls.b) as m:
            cls.want_b = greedy(m)
        assert cls.want_a != cls.want_b

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.server = ServerProcess(self.a, os.path.join(self.tmp, f"{self.id()}.log"))
        self.client = rl.InferenceClient(self.server.url)

    def tearDown(self):
        self.client.close()
        self.assertEqual(self.server.stop(), 0, "rlhost serve exits 0 on SIGTERM")

    def served(self):
        r = self.client.generate({"input_ids": PROMPT,
                                  "sampling_params": {"temperature": 0, "max_new_tokens": 12,
                                                      "stop_token_ids": []}})
        return r["output_ids"]

    def test_python_sync_distributed_then_disk_serves_the_new_weights(self):
        self.assertEqual(self.served(), self.want_a)
        with rl.Model(self.b) as b:
            out = self.client.sync(b, 1, {"mode": "distributed"})
            self.assertEqual(out.scalars["skipped"], 0)
            self.assertEqual(out.texts["server_version"], "1")
            self.assertGreater(out.metrics["sync/bytes"], 0)
            self.assertEqual(self.served(), self.want_b)
            self.assertEqual(self.client.sync(b, 1).scalars["skipped"], 1)
        with rl.Model(self.a) as a:
            shared = os.path.join(self.tmp, "shared")
            out = self.client.sync(a, 2, {"mode": "disk", "dir": shared})
            self.assertEqual(out.scalars["skipped"], 0)
            self.assertEqual(self.served(), self.want_a)
            self.assertEqual(self.client.call("GET", "/get_model_info")["weight_version"], "2")

    def test_a_refused_update_reports_the_servers_message_and_keeps_serving(self):
        with self.assertRaises(rl.Error) as e:
            self.client.call("POST", "/update_weights_from_disk", {"model_path": "/nonexistent"})
        self.assertIn("is not a folder", str(e.exception))
        self.assertEqual(self.served(), self.want_a)

    def test_lua_script_syncs_and_generates_through_rl_inference_client(self):
        shared = os.path.join(self.tmp, "lua-shared")
        run = subprocess.run([RLHOST, "run", os.path.join(SCRIPTS, "sync.lua"), "--",
                              self.server.url, self.b, shared],
                             capture_output=True, text=True, timeout=300, cwd=self.tmp)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        tokens = json.loads(re.search(r"^TOKENS (.*)$", run.stdout, re.M).group(1))
        self.assertEqual(tokens, self.want_b)
        self.assertIn("VERSION 8", run.stdout)

    def test_grpo_example_takes_its_rollouts_from_the_server_and_syncs_it_each_step(self):
        work = os.path.join(self.tmp, "grpo")
        os.makedirs(work, exist_ok=True)
        run = subprocess.run(
            [RLHOST, "run", os.path.join(SOURCE, "examples", "grpo.lua"),
             "--config", os.path.join(SOURCE, "tests", "lua", "scripts", "grpo_test.yaml"),
             "--set", "run.steps=5", "--set", "run.checkpoint_every=0",
             "--set", f"inference_server.url={self.server.url}"],
            capture_output=True, text=True, timeout=600, cwd=work)
        self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
        with open(os.path.join(work, "runs", "grpo_test", "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        rl_steps = [r for r in records if r["phase"] == "rl"]
        self.assertEqual(len(rl_steps), 5)
        self.assertTrue(all("reward" in r for r in rl_steps))
        # 3 warm-up steps, then one optimizer step per RL step that trained: the
        # server must carry the trainer's last version.
        trained = sum(1 for r in rl_steps if "grad_norm" in r)
        self.assertGreater(trained, 0)
        info = self.client.call("GET", "/get_model_info")
        self.assertEqual(info["weight_version"], str(3 + trained))


    def test_grpo_with_qerl_noise_runs_only_against_a_server_with_the_runs_schedule(self):
        work = os.path.join(self.tmp, "grpo-noise")
        os.makedirs(work, exist_ok=True)

        def grpo(url):
            return subprocess.run(
                [RLHOST, "run", os.path.join(SOURCE, "examples", "grpo.lua"),
                 "--config", os.path.join(SOURCE, "tests", "lua", "scripts", "grpo_test.yaml"),
                 "--set", "run.steps=4", "--set", "run.checkpoint_every=0",
                 "--set", "engine.noise_scheduler.enabled=true",
                 "--set", "engine.noise_scheduler.num_stages=2",
                 "--set", f"inference_server.url={url}"],
                capture_output=True, text=True, timeout=600, cwd=work)

        # This class's server samples without noise: refused before any step.
        run = grpo(self.server.url)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("samples without noise", run.stdout + run.stderr)
        # grpo_test.yaml: run.seed 1, sft.steps 3. A server with another seed is refused
        # naming the key, both values and the flag.
        schedule = ["--noise-total-steps", "4", "--noise-num-stages", "2",
                    "--noise-first-step", "3"]
        other = ServerProcess(self.a, os.path.join(self.tmp, "noise-seed2.log"),
                              schedule + ["--noise-seed", "2"])
        try:
            run = grpo(other.url)
        finally:
            other.stop()
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("run.seed is 1 in this run but 2 on the server", run.stdout + run.stderr)
        self.assertIn("--noise-seed", run.stdout + run.stderr)
        # The run's schedule: the run trains, and the server samples each version with
        # the schedule's sigma (2 stages of 2 steps: noise-free, then sigma_start).
        same = ServerProcess(self.a, os.path.join(self.tmp, "noise-seed1.log"),
                             schedule + ["--noise-seed", "1"])
        try:
            run = grpo(same.url)
            self.assertEqual(run.returncode, 0, run.stdout[-3000:] + run.stderr[-3000:])
            client = rl.InferenceClient(same.url)
            version = int(client.call("GET", "/get_model_info")["weight_version"])
            info = client.call("GET", "/get_server_info")
            client.close()
        finally:
            same.stop()
        self.assertTrue(info["noise_scheduler"]["enabled"])
        trained = version - 3
        self.assertGreater(trained, 0)
        self.assertEqual(info["scheduler"]["noise_sigma"], 0.05 if trained >= 2 else 0.0)


class RemoteRoutings(unittest.TestCase):
    """R3 from a server: rollouts of rl_inference_client_rollouts with
    sampling.return_routed_experts carry the routing `rlhost serve` returned
    (meta_info routed_experts), equal to the co-located engine's for the same
    seed, and with sampling.return_expert_logits the mixing weights
    (meta_info expert_logits); the batch packs both."""

    def test_server_rollouts_carry_the_routing_the_engine_records(self):
        tmp = tempfile.mkdtemp(prefix="rl-serve-r3-")
        try:
            model_dir = os.path.join(tmp, "moe")
            rl.init_model("tiny-moe", model_dir, 5)
            server = ServerProcess(model_dir, os.path.join(tmp, "server.log"))
            tasks = [{"prompt": "ab"}, {"prompt": "moe"}]
            opts = {"sampling": {"n": 2, "max_tokens": 5, "seed": 9, "temperature": 1.0,
                                 "return_routed_experts": True, "return_expert_logits": True}}
            try:
                with rl.InferenceClient(server.url) as client, rl.Model(model_dir) as model:
                    with client.rollouts(model, tasks, opts) as remote, \
                            model.engine() as engine:
                        got = remote.routed_experts()
                        got_w = remote.routed_expert_weights()
                        self.assertEqual(len(got), 4)
                        self.assertEqual(len(got_w), 4)
                        # The server samples each prompt as the engine samples
                        # a call of that prompt alone (its own seed stream).
                        for p, task in enumerate(tasks):
                            with engine.rollouts([task], sampling=opts["sampling"]) as local:
                                want = json.loads(local.info().texts["completions"])
                                have = json.loads(remote.info().texts["completions"])
                                self.assertEqual(have[2 * p:2 * p + 2], want)
                                self.assertEqual(got[2 * p:2 * p + 2], local.routed_experts())
                                want_w = local.routed_expert_weights()
                                for have_r, want_r in zip(got_w[2 * p:2 * p + 2], want_w):
                                    self.assertEqual(len(have_r), len(want_r))
                                    for have_t, want_t in zip(have_r, want_r):
                                        for a, b in zip(sum(have_t, []), sum(want_t, [])):
                                            self.assertAlmostEqual(a, b, delta=1e-6)
                        remote.set_rewards([1.0, 0.0, 1.0, 0.0])
                        with remote.to_batch() as batch:
                            flat = [e for r in got for row in r for layer in row for e in layer]
                            self.assertEqual(batch.info().tensors["routed_experts"], flat)
                            flat_w = [x for r in got_w for row in r for layer in row for x in layer]
                            self.assertEqual(batch.info().tensors["routed_expert_weights"], flat_w)
            finally:
                self.assertEqual(server.stop(), 0)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class StopSignal(unittest.TestCase):
    """A request that nothing can interrupt must not keep a stopped server alive."""

    def test_sigterm_ends_the_server_while_a_group_waits_for_an_unreachable_master(self):
        tmp = tempfile.mkdtemp(prefix="rl-serve-stop-")
        try:
            model = os.path.join(tmp, "m")
            rl.init_model("tiny", model, 7)
            server = ServerProcess(model, os.path.join(tmp, "server.log"))
            port = free_port()  # a port where nobody listens
            body = json.dumps({"master_address": "127.0.0.1", "master_port": port,
                               "rank_offset": 1, "world_size": 2, "group_name": "stuck",
                               "backend": "gloo"}).encode()
            request = urllib.request.Request(server.url + "/init_weights_update_group",
                                             data=body, method="POST",
                                             headers={"Content-Type": "application/json"})

            def join():
                try:
                    urllib.request.urlopen(request, timeout=300).read()
                except Exception:  # the server goes away under it: expected
                    pass

            threading.Thread(target=join, daemon=True).start()
            time.sleep(2)  # the group's store connection is now retrying
            t0 = time.time()
            rc = server.stop()  # SIGTERM; kills only after 30 s
            elapsed = time.time() - t0
            with open(os.path.join(tmp, "server.log")) as f:
                log = f.read()
            self.assertLess(elapsed, 25, "SIGTERM did not end the server; log: " + log[-2000:])
            self.assertEqual(rc, 1, log[-2000:])
            self.assertIn("requests still running", log)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
