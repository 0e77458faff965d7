"""The unmodified xorl-client against `rlhost training-server --lora off` and
an `rlhost serve` inference server: a full-weight model trained through the
client, the inference server registered with add_inference_endpoint (listed,
removed), and sync_inference_weights; the server's greedy tokens then equal
the trained model's (saved with save_state and loaded by rl). An endpoint
that does not answer, and a sync without endpoints, are refused with a
message; without --lora off the client's model is a LoRA adapter, whose sync
is refused naming why; malformed endpoint and sync requests get a 400 naming
the field. A LoRA adapter trained through the client, saved for the sampler
and opened with create_sampling_client, is loaded on the `rlhost serve`
endpoint and sampled there by lora_path (its greedy tokens are the adapter's,
not the base model's); an adapter the server lacks is a 400 naming lora_path.
Skips (77) without xorl_client (no PyPI)."""

import glob
import os
import re
import subprocess
import sys
import tempfile
import unittest
import urllib.error
import urllib.request
import json

try:
    import xorl_client
except ImportError as e:
    print(f"skipping: {e}")
    sys.exit(77)

import rl

RLHOST = os.environ["RL_TEST_RLHOST"]
PROMPT = [104, 101, 108, 108, 111, 10]


def start(args):
    proc = subprocess.Popen([RLHOST] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    while True:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise RuntimeError(f"rlhost {args[0]} did not start: {proc.stderr.read()}")
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)


def stop(proc):
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def served_greedy(url):
    body = json.dumps({"input_ids": PROMPT, "sampling_params": {
        "temperature": 0, "max_new_tokens": 12, "stop_token_ids": []}}).encode()
    req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["output_ids"]


def own_greedy(model_dir, adapter_dir=None):
    with rl.Model(model_dir, {"threads": 1}) as m, m.engine() as e:
        params = {"temperature": 0, "max_tokens": 12, "stop_token_ids": []}
        if adapter_dir:
            m.load_adapter("trained", adapter_dir)
            params["adapter"] = "trained"
        res = e.generate([PROMPT], params)
        return res.tensors["token_ids"]


class XorlClient(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="rl-xorl-")
        self.base = os.path.join(self.tmp.name, "tiny")
        rl.init_model("tiny", self.base, 7)
        self.ckpt = os.path.join(self.tmp.name, "ckpt")
        self.trainer, self.train_url = start(
            ["training-server", "--model", self.base, "--port", "0", "--threads", "1",
             "--lora", "off", "--checkpoint-dir", self.ckpt])
        self.server, self.serve_url = start(
            ["serve", "--model", self.base, "--port", "0", "--threads", "1"])

    def tearDown(self):
        for proc in (self.server, self.trainer):
            code, err = stop(proc)
            self.assertEqual(code, 0, err[-2000:])
        self.tmp.cleanup()

    def test_trained_weights_reach_a_registered_inference_server(self):
        svc = xorl_client.ServiceClient(base_url=self.train_url)
        tc = svc.create_training_client(base_model="tiny")
        text = list(b"the quick brown fox\n")
        datum = xorl_client.Datum(
            model_input=xorl_client.ModelInput.from_ints(text[:-1]),
            loss_fn_inputs={"target_tokens": text[1:], "weights": [1.0] * (len(text) - 1)})
        for _ in range(4):
            tc.forward_backward([datum], loss_fn="cross_entropy").result()
            tc.optim_step(xorl_client.AdamParams(learning_rate=1e-2)).result()
        before = served_greedy(self.serve_url)
        self.assertEqual(before, own_greedy(self.base))

        port = int(self.serve_url.rsplit(":", 1)[1])
        added = tc.add_inference_endpoint(host="127.0.0.1", port=port, world_size=1).result()
        self.assertTrue(added.success, added.message)
        self.assertEqual(added.endpoint.port, port)
        self.assertEqual(added.endpoint.server_info.model_path, self.base)
        listed = tc.list_inference_endpoints().result()
        self.assertEqual(listed.count, 1)

        synced = tc.sync_inference_weights(master_address="127.0.0.1", master_port=0,
                                           group_name="xorl_sync", buffer_size_mb=1).result()
        self.assertTrue(synced.success, synced.message)
        self.assertEqual(len(synced.endpoints_synced), 1)
        self.assertTrue(synced.endpoints_synced[0].success, synced.endpoints_synced[0].message)
        self.assertGreater(synced.total_bytes, 1_000_000)
        self.assertGreater(synced.num_buckets, 1)  # 1 MiB buckets of a 12 MiB model

        # The trained model, as the training server saves it, loaded by rl.
        tc.save_state("after-sync").result()
        (model_dir,) = glob.glob(os.path.join(self.ckpt, "**", "after-sync", "**", "config.json"),
                                 recursive=True)
        trained = own_greedy(os.path.dirname(model_dir))
        self.assertNotEqual(trained, before, "training changed nothing the test can see")
        self.assertEqual(served_greedy(self.serve_url), trained)

        removed = tc.remove_inference_endpoint(host="127.0.0.1", port=port).result()
        self.assertTrue(removed.success, removed.message)
        self.assertEqual(tc.list_inference_endpoints().result().count, 0)
        none = tc.sync_inference_weights(master_port=0).result()
        self.assertFalse(none.success)
        self.assertIn("no inference endpoints are registered", none.message)

    def test_an_endpoint_that_does_not_answer_is_not_registered(self):
        svc = xorl_client.ServiceClient(base_url=self.train_url)
        tc = svc.create_training_client(base_model="tiny")
        added = tc.add_inference_endpoint(host="127.0.0.1", port=9, world_size=1).result()
        self.assertFalse(added.success)
        self.assertIn("http://127.0.0.1:9 does not answer", added.message)
        self.assertEqual(tc.list_inference_endpoints().result().count, 0)

    def test_connect_and_disconnect_inference_endpoint_are_refused_saying_why(self):
        # xorl's server defines neither route; ours answers in the client's shape.
        svc = xorl_client.ServiceClient(base_url=self.train_url)
        tc = svc.create_training_client(base_model="tiny")
        connected = tc.connect_inference_endpoint(master_port=0).result()
        self.assertFalse(connected.success)
        self.assertIn("connect_inference_endpoint is not supported", connected.message)
        self.assertIn("sync_inference_weights forms the weight-update group", connected.message)
        self.assertEqual(connected.connected_endpoints, [])
        disconnected = tc.disconnect_inference_endpoint().result()
        self.assertFalse(disconnected.success)
        self.assertIn("disconnect_inference_endpoint is not supported", disconnected.message)

    def test_malformed_endpoint_requests_are_refused_naming_the_field(self):
        def post(path, body):
            req = urllib.request.Request(self.train_url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=60)
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()
            return 200, ""
        cases = [
            ("/add_inference_endpoint", {"port": 30000}, "host is required"),
            ("/add_inference_endpoint", {"host": "127.0.0.1", "port": 70000}, "port"),
            ("/add_inference_endpoint", {"host": "127.0.0.1", "port": 1, "colour": 1}, "colour"),
            ("/remove_inference_endpoint", {"host": "127.0.0.1"}, "port is required"),
            ("/sync_inference_weights", {"sync_method": "rdma"}, "sync_method 'rdma'"),
            ("/sync_inference_weights", {"buffer_size_mb": 0}, "buffer_size_mb"),
            ("/sync_inference_weights", {"group_name": ""}, "group_name must not be empty"),
        ]
        for path, body, want in cases:
            code, text = post(path, body)
            self.assertEqual(code, 400, f"{path} {body}: {text}")
            self.assertIn(want, text, f"{path} {body}")

    def test_a_lora_model_is_not_synced_as_full_weights(self):
        # Without --lora off the client's lora_config makes a LoRA adapter (Tinker's way).
        proc, url = start(["training-server", "--model", self.base, "--port", "0",
                           "--threads", "1", "--checkpoint-dir", self.ckpt + "-lora"])
        try:
            svc = xorl_client.ServiceClient(base_url=url)
            tc = svc.create_training_client(base_model="tiny")
            port = int(self.serve_url.rsplit(":", 1)[1])
            self.assertTrue(tc.add_inference_endpoint(host="127.0.0.1", port=port).result().success)
            refused = tc.sync_inference_weights(master_port=0).result()
            self.assertFalse(refused.success)
            self.assertIn("is a LoRA adapter", refused.message)
            self.assertIn("--lora off", refused.message)
        finally:
            code, err = stop(proc)
            self.assertEqual(code, 0, err[-2000:])


    def test_a_trained_adapter_samples_through_rlhost_serve_by_lora_path(self):
        # xorl's LoRA flow: train, save_weights_for_sampler (a xorl:// path),
        # list_checkpoints, then create_sampling_client loads the adapter on the
        # registered inference server (/load_lora_adapter) and the client's
        # SamplingClient sends its name as /generate's lora_path.
        ckpt = self.ckpt + "-lora"
        proc, url = start(["training-server", "--model", self.base, "--port", "0",
                           "--threads", "1", "--checkpoint-dir", ckpt])
        try:
            svc = xorl_client.ServiceClient(base_url=url)
            tc = svc.create_training_client(base_model="tiny")  # the client's lora_config
            target = list(b"zebra zebra zebra\n")
            text = PROMPT + target
            weights = [0.0] * (len(PROMPT) - 1) + [1.0] * len(target)
            datum = xorl_client.Datum(
                model_input=xorl_client.ModelInput.from_ints(text[:-1]),
                loss_fn_inputs={"target_tokens": text[1:], "weights": weights})
            for _ in range(10):
                tc.forward_backward([datum], loss_fn="cross_entropy").result()
                tc.optim_step(xorl_client.AdamParams(learning_rate=2e-2)).result()
            saved = tc.save_weights_for_sampler("adapter-001").result()
            self.assertTrue(saved.path.startswith("xorl://"), saved.path)
            self.assertTrue(saved.path.endswith("/sampler_weights/adapter-001"), saved.path)
            listed = tc.list_checkpoints().result()
            self.assertIn(saved.path, [c.path for c in listed.checkpoints])

            port = int(self.serve_url.rsplit(":", 1)[1])
            self.assertTrue(tc.add_inference_endpoint(host="127.0.0.1", port=port).result().success)
            sc = svc.create_sampling_client(base_url=self.serve_url, model_path=saved.path)
            params = xorl_client.SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[])
            out = sc.sample(xorl_client.ModelInput.from_ints(PROMPT), params).result()
            tokens = out.sequences[0].tokens
            self.assertEqual(len(out.sequences[0].logprobs), len(tokens))

            # The adapter is what rlhost serve sampled with: the trained folder
            # loaded by rl gives the same greedy tokens, the base model others.
            (config,) = glob.glob(os.path.join(ckpt, "**", "adapter-001", "**",
                                               "adapter_config.json"), recursive=True)
            trained = own_greedy(self.base, os.path.dirname(config))
            self.assertEqual(tokens, trained)
            base = served_greedy(self.serve_url)
            self.assertEqual(base, own_greedy(self.base))
            self.assertNotEqual(tokens, base, "the adapter was not used")

            # A later adapter is served next to the first: each sampling client
            # gets its own.
            for _ in range(3):
                tc.forward_backward([datum], loss_fn="cross_entropy").result()
                tc.optim_step(xorl_client.AdamParams(learning_rate=2e-2)).result()
            later = tc.save_weights_for_sampler("adapter-002").result()
            sc2 = svc.create_sampling_client(base_url=self.serve_url, model_path=later.path)
            seeded = xorl_client.SamplingParams(max_tokens=12, temperature=1.0, seed=3,
                                                stop_token_ids=[])
            def sampled(client):
                seq = client.sample(xorl_client.ModelInput.from_ints(PROMPT),
                                    seeded).result().sequences[0]
                return seq.tokens, seq.logprobs
            first = sampled(sc)
            self.assertNotEqual(sampled(sc2), first)
            self.assertEqual(sampled(sc), first)

            # An adapter the inference server does not have: a 400 naming lora_path.
            missing = xorl_client.SamplingClient(
                base_url=self.serve_url, model_path="xorl://default/sampler_weights/missing",
                max_retries=0)
            with self.assertRaises(RuntimeError) as cm:
                missing.sample(xorl_client.ModelInput.from_ints(PROMPT), params).result()
            self.assertIn("HTTP 400", str(cm.exception))
            self.assertIn("lora_path 'missing' is not a loaded LoRA adapter", str(cm.exception))
        finally:
            code, err = stop(proc)
            self.assertEqual(code, 0, err[-2000:])


if __name__ == "__main__":
    unittest.main()
