"""The unmodified `tinker` SDK from PyPI (in a test venv) against `rlhost training-server` on
the tiny model: a LoRA training client does a short SFT (the loss falls), saves its weights
for a sampler and samples; then an RL loop written only with the SDK (importance_sampling,
group-normalized advantages computed here) raises the reward on reverse_text. The env
(tasks and rewards) comes from the rl Python SDK; everything that trains or samples goes
through the Tinker SDK. Runs under the current SDK (protobuf wire) and under 0.16 (JSON)."""

import json
import os
import sys
import unittest
import urllib.error
import urllib.request

os.environ.setdefault("TINKER_TELEMETRY", "0")

try:
    import tinker
    from tinker import types
except ImportError:
    print("the tinker package is not installed in this venv (no PyPI?): skipped")
    sys.exit(77)

import rl
from rlhost_server import RlhostServer

API_KEY = "tml-rl-test-key"


def datum(tokens, targets, **inputs):
    """A Datum for next-token prediction: model input `tokens`, one target per token."""
    loss_inputs = {"target_tokens": types.TensorData(data=list(targets), dtype="int64",
                                                     shape=[len(targets)])}
    for name, values in inputs.items():
        loss_inputs[name] = types.TensorData(data=[float(v) for v in values], dtype="float32",
                                             shape=[len(values)])
    return types.Datum(model_input=types.ModelInput.from_ints(list(tokens)),
                       loss_fn_inputs=loss_inputs)


def ready(client):
    """The client itself: newer SDKs return a future of it (usable, deprecated, as the client)."""
    return client.result() if type(client).__name__.startswith("Backcompat") else client


def text(tokens):
    """The tiny model's bytes as text (ids above 255 are its special tokens, e.g. EOS)."""
    return bytes(t for t in tokens if t < 256).decode("utf-8", "replace")


def encode(text):
    return list(text.encode("utf-8"))  # the tiny model's tokens are bytes


class TinkerSdkTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = RlhostServer("training-server", "--api-key", API_KEY, checkpoint_dir=True)
        cls.url = cls.server.url
        cls.service = tinker.ServiceClient(base_url=cls.url, api_key=API_KEY)

    @classmethod
    def tearDownClass(cls):
        try:
            if hasattr(cls.service, "close"):  # tinker >= 0.38 finishes its session
                cls.service.close("success").result()
        finally:
            cls.server.stop()

    def test_closing_a_service_client_finishes_its_session(self):
        if not hasattr(tinker.ServiceClient, "close"):
            self.skipTest("this tinker release has no ServiceClient.close()")
        service = tinker.ServiceClient(base_url=self.url, api_key=API_KEY)
        trainer = ready(service.create_lora_training_client(base_model="tiny", rank=4))
        data = [datum(encode("ab"), encode("ba"))]
        trainer.forward_backward(data, "cross_entropy").result()
        service.close("success", detail="done").result()  # POST /api/v1/sessions/{id}/finish
        # The closed client no longer calls; the server refuses the model to anyone.
        request = urllib.request.Request(
            self.url + "/api/v1/get_info", data=json.dumps({"model_id": trainer.model_id}).encode(),
            method="POST", headers={"Content-Type": "application/json", "X-API-Key": API_KEY})
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=60)
        self.assertEqual(e.exception.code, 410)
        self.assertIn("was finished by its client (success: done)", e.exception.read().decode())

    def test_lora_sft_then_sampling(self):
        caps = self.service.get_server_capabilities()
        self.assertEqual(caps.supported_models[0].model_name, "tiny")
        trainer = ready(self.service.create_lora_training_client(base_model="tiny", rank=8))
        texts = ["reverse: abc\ncba\n", "reverse: hello\nolleh\n", "reverse: ab\nba\n"]
        data = []
        for t in texts:
            ids = encode(t)
            prompt = len(encode(t.split("\n")[0] + "\n"))
            weights = [0.0] * (prompt - 1) + [1.0] * (len(ids) - prompt)
            data.append(datum(ids[:-1], ids[1:], weights=weights))
        losses = []
        for _ in range(12):
            fb = trainer.forward_backward(data, "cross_entropy").result()
            losses.append(fb.metrics["loss:sum"])
            self.assertEqual(len(fb.loss_fn_outputs), len(data))
            lp = fb.loss_fn_outputs[0]["logprobs"]
            self.assertEqual(len(lp.tolist()), len(encode(texts[0])) - 1)
            trainer.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        print("SFT losses:", [round(x, 3) for x in losses])
        self.assertLess(losses[-1], 0.8 * losses[0])

        sampler = ready(trainer.save_weights_and_get_sampling_client())
        prompt = types.ModelInput.from_ints(encode("reverse: abc\n"))
        out = sampler.sample(prompt=prompt, num_samples=2,
                             sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0,
                                                                  seed=3)).result()
        self.assertEqual(len(out.sequences), 2)
        for seq in out.sequences:
            self.assertGreater(len(seq.tokens), 0)
            self.assertEqual(len(seq.logprobs), len(seq.tokens))
            self.assertIn(seq.stop_reason, ("stop", "length"))
        logprobs = sampler.compute_logprobs(prompt).result()
        self.assertIsNone(logprobs[0])
        self.assertEqual(len(logprobs), len(encode("reverse: abc\n")))

        # A named checkpoint: save_state, a new training client from it (weights_info,
        # create_model, load_weights), and a sampler from saved weights.
        state = trainer.save_state("after-sft").result()
        self.assertTrue(state.path.startswith("tinker://"))
        restored = ready(self.service.create_training_client_from_state(state.path))
        fb_a = trainer.forward(data[:1], "cross_entropy").result()
        fb_b = restored.forward(data[:1], "cross_entropy").result()
        for a, b in zip(fb_a.loss_fn_outputs[0]["logprobs"].tolist(),
                        fb_b.loss_fn_outputs[0]["logprobs"].tolist()):
            self.assertAlmostEqual(a, b, places=5)
        saved = trainer.save_weights_for_sampler("sft-weights").result()
        named = ready(self.service.create_sampling_client(model_path=saved.path))
        again = named.sample(prompt=prompt, num_samples=1,
                             sampling_params=types.SamplingParams(max_tokens=6, seed=3)).result()
        self.assertEqual([int(t) for t in again.sequences[0].tokens],
                         [int(t) for t in out.sequences[0].tokens])

    def test_rl_importance_sampling_raises_reward_on_reverse_text(self):
        runtime = rl.Runtime()
        env = runtime.create("env", "reverse_text", {"alphabet": "ab", "min_len": 2, "max_len": 4})
        trainer = ready(self.service.create_lora_training_client(base_model="tiny", rank=16))
        groups, n, steps = 6, 8, int(os.environ.get("RL_TEST_TINKER_RL_STEPS", "10"))
        rewards = []
        for step in range(steps):
            sampler = ready(trainer.save_weights_and_get_sampling_client())
            tasks = env.sample(groups, seed=1000 + step)
            futures = []
            for task in tasks:
                prompt = encode(task["prompt"])
                futures.append((task, prompt, sampler.sample(
                    prompt=types.ModelInput.from_ints(prompt), num_samples=n,
                    sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0,
                                                         stop=["\n"]))))
            data, step_rewards = [], []
            for task, prompt, fut in futures:
                seqs = [([int(t) for t in s.tokens], [float(x) for x in s.logprobs])
                        for s in fut.result().sequences]
                rs = [env.score(task, text(t)).scalars["reward"]
                      for t, _ in seqs]
                step_rewards.extend(rs)
                mean = sum(rs) / len(rs)
                for (tokens, logprobs), r in zip(seqs, rs):
                    adv = r - mean
                    if adv == 0 or not tokens:
                        continue
                    full = prompt + tokens
                    zeros = [0.0] * (len(prompt) - 1)
                    data.append(datum(full[:-1], full[1:], logprobs=zeros + logprobs,
                                      advantages=zeros + [adv] * len(tokens)))
            rewards.append(sum(step_rewards) / len(step_rewards))
            if data:
                trainer.forward_backward(data, "importance_sampling").result()
                trainer.optim_step(types.AdamParams(learning_rate=5e-3)).result()
        print("RL rewards:", [round(r, 3) for r in rewards])
        first, last = sum(rewards[:2]) / 2, sum(rewards[-3:]) / 3
        self.assertGreater(last, first + 0.05, rewards)
        env.close()
        runtime.close()


if __name__ == "__main__":
    unittest.main()
