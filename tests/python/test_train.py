"""Python embeds the training API (train.h) and the typed RL step (step.h):
same numbers as the C API, errors that name the bad argument, and
examples/grpo.py equal to examples/grpo.lua step for step."""

import ctypes as C
import json
import os
import subprocess
import sys
import tempfile
import unittest

import rl
from rl import _capi as A

PLUGINS = os.environ["RL_TEST_PLUGIN_DIR"]
RLHOST = os.environ.get("RL_TEST_RLHOST")
SOURCE = os.environ.get("RL_TEST_SOURCE_DIR")


class Tiny:
    """The built-in tiny model, written once per test run."""
    _dir = None

    @classmethod
    def path(cls):
        if cls._dir is None:
            cls._tmp = tempfile.TemporaryDirectory()
            cls._dir = os.path.join(cls._tmp.name, "tiny")
            rl.init_model("tiny", cls._dir, 7)
        return cls._dir


class LayoutTest(unittest.TestCase):
    def test_ctypes_structs_have_the_pinned_c_sizes(self):
        # The sizes tests/abi/layout_test.cpp pins for the C structs.
        pinned = {A.StringView: 16, A.TensorView: 48, A.TensorArg: 56, A.TensorList: 16,
                  A.RuntimeDesc: 32, A.LossInputs: 88, A.AdvantageInputs: 168,
                  A.RolloutView: 112, A.Batch: 136}
        for struct, size in pinned.items():
            self.assertEqual(C.sizeof(struct), size, struct.__name__)


class TransportTest(unittest.TestCase):
    """Transports and weight sync from Python (docs/transports.md)."""

    @classmethod
    def setUpClass(cls):
        cls.rt = rl.Runtime(plugin_path=PLUGINS, default_plugins=False)

    @classmethod
    def tearDownClass(cls):
        cls.rt.close()

    def test_messages_round_trip_in_order_and_receive_times_out(self):
        with tempfile.TemporaryDirectory() as d:
            tx = self.rt.create("transport", "filesystem", {"dir": d})
            rx = self.rt.create("transport", "filesystem", {"dir": d, "poll_ms": 5})
            for i in range(3):
                tx.send({"i": i}, {"ids": [i, 2, 3], "x": [0.5 * i]})
            for i in range(3):
                header, tensors = rx.recv(5000)
                self.assertEqual(header, {"i": i})
                self.assertEqual(tensors["ids"], [i, 2, 3])
                self.assertEqual(tensors["x"], [0.5 * i])
            self.assertIsNone(rx.recv(50))
            with self.assertRaises(rl.Error) as cm:
                tx.send({"tensors": 1})
            self.assertIn("'tensors' is reserved", str(cm.exception))

    def test_weights_reach_another_model_with_their_version(self):
        with tempfile.TemporaryDirectory() as d:
            src = rl.Model(Tiny.path(), {"threads": 1})
            dst = rl.Model(Tiny.path(), {"threads": 1})
            tx = self.rt.create("transport", "filesystem", {"dir": d, "channel": "broadcasts"})
            rx = self.rt.create("transport", "filesystem",
                                {"dir": d, "channel": "broadcasts", "mode": "latest"})
            sent = src.send_weights(tx, 4)
            self.assertEqual(sent.metrics["sync/version"], 4)
            got = dst.recv_weights(rx, 5000)
            self.assertEqual(got.scalars["version"], 4)
            self.assertEqual(got.metrics["sync/bytes"], sent.metrics["sync/bytes"])
            self.assertEqual(dst.info()["policy_version"], 4)
            self.assertIsNone(dst.recv_weights(rx, 50))


class TrainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = rl.Runtime(plugin_path=PLUGINS, default_plugins=False)
        cls.model = rl.Model(Tiny.path(), {"threads": 1})

    @classmethod
    def tearDownClass(cls):
        cls.model.close()
        cls.rt.close()

    def test_model_info_and_tokenizer_round_trip(self):
        info = self.model.info()
        self.assertEqual(info["vocab_size"], 259)
        ids = self.model.encode("Reverse: abc")
        self.assertEqual(self.model.decode(ids), "Reverse: abc")
        prompt = self.model.apply_chat_template([{"role": "user", "content": "hi"}], "chatml")
        self.assertIn("<|im_start|>user\nhi<|im_end|>", prompt)
        # The tiny model's own template is ChatML; tools need the model's own template.
        own = self.model.apply_chat_template([{"role": "user", "content": "hi"}],
                                             chat_template_kwargs={"enable_thinking": False})
        self.assertEqual(own, prompt)
        with self.assertRaises(rl.Error):
            self.model.apply_chat_template([{"role": "user", "content": "hi"}], "chatml",
                                           tools=[])

    def test_special_token_text_stays_text_and_tokenizer_loads_alone(self):
        text = "a<|im_end|>b"
        self.assertEqual(len(self.model.encode(text)), 3)
        self.assertEqual(len(self.model.encode(text, plain_text=True)), len(text))
        ids, prompt = self.model.encode_chat([{"role": "user", "content": text}])
        self.assertEqual(sum(1 for i in ids if i >= 256), 3)  # the template's own tokens
        self.assertEqual(self.model.decode(ids, skip_special_tokens=True),
                         "user\n" + text + "\nassistant\n")
        with rl.load_tokenizer(Tiny.path()) as tok:
            self.assertFalse(tok.info()["has_model"])
            self.assertEqual(tok.encode(text, plain_text=True),
                             self.model.encode(text, plain_text=True))
            with self.assertRaises(rl.Error) as cm:
                tok.trainer()
            self.assertEqual(cm.exception.status, "RL_ERR_BAD_STATE")

    def test_the_trainer_scores_a_batch_at_its_sampling_temperature(self):
        trainer = self.model.trainer()
        engine = self.model.engine()
        prompt = self.model.encode("Reverse: abc\n")
        out = engine.generate([prompt], {"n": 2, "max_tokens": 6, "seed": 3, "temperature": 0.7})
        cu = out.tensors["cu_seqlens"]
        toks = out.tensors["token_ids"]
        ids, seq_cu, positions = [], [0], []
        for s in range(len(cu) - 1):
            start = len(ids)
            ids += prompt + toks[cu[s]:cu[s + 1]]
            positions += list(range(start + len(prompt), len(ids)))
            seq_cu.append(len(ids))
        batch = {"input_ids": ids, "cu_seqlens": seq_cu, "sampling_temperature": 0.7}
        res = trainer.forward(batch)
        self.assertEqual(res.scalars["logprob_temperature"], 0.7)
        lp = [res.tensors["logprobs"][p] for p in positions]
        for a, b in zip(lp, out.tensors["logprobs"]):
            self.assertAlmostEqual(a, b, delta=2e-5)
        del batch["sampling_temperature"]
        at1 = [trainer.forward(batch).tensors["logprobs"][p] for p in positions]
        self.assertGreater(max(abs(a - b) for a, b in zip(at1, out.tensors["logprobs"])), 0.05)
        engine.close()
        trainer.close()

    def test_seed_equals_the_lua_module(self):
        # rl.seed(0, "rl", 3) in Lua (scripting/lua/rl/init.lua).
        self.assertEqual(rl.seed(0, "rl", 3), 6535251894777909)
        self.assertNotEqual(rl.seed(0, "rl", 3), rl.seed(0, "rl", 4))

    def test_a_training_step_lowers_the_loss_on_its_batch(self):
        with self.model.trainer({"learning_rate": 1e-2, "seed": 1}) as trainer:
            ce = self.rt.create("loss", "causallm_loss")
            tasks = [{"prompt": "Reverse: abc\n", "answer": "cba"}]
            with self.model.sft_batch(tasks, self.model.info()["eos_token_ids"][0]) as batch:
                first = trainer.forward_backward(batch, ce).scalars["loss"]
                for _ in range(3):
                    trainer.optim_step()
                    later = trainer.forward_backward(batch, ce).scalars["loss"]
                self.assertLess(later, first)
            # a dict batch works too, and a wrong tensor is refused by name
            ids = self.model.encode("Reverse: ab\nba")
            out = trainer.forward({"input_ids": ids, "cu_seqlens": [0, len(ids)]})
            self.assertEqual(len(out.tensors["logprobs"]), len(ids))

    def test_generation_with_a_seed_is_deterministic(self):
        with self.model.engine() as engine:
            ids = self.model.encode("Reverse: abc\n")
            a = engine.generate([ids], {"n": 2, "max_tokens": 6, "seed": 5})
            b = engine.generate([ids], {"n": 2, "max_tokens": 6, "seed": 5})
            self.assertEqual(a.tensors["token_ids"], b.tensors["token_ids"])
            self.assertEqual(len(json.loads(a.texts["completions"])), 2)

    def test_the_typed_step_from_rollouts_to_an_update(self):
        env = self.rt.create("env", "reverse_text")
        adv = self.rt.create("advantage", "grpo")
        loss = self.rt.create("loss", "policy_loss")
        with self.model.trainer({"learning_rate": 1e-3, "seed": 1}) as trainer, \
                self.model.engine() as engine, rl.Buffer({"group_size": 4}) as buffer:
            engine.sync_weights(buffer)  # the model may have been trained by an earlier test
            tasks = env.sample(3, 11)
            with engine.rollouts(tasks, group_offset=0,
                                 sampling={"n": 4, "max_tokens": 6, "seed": 2}) as ro:
                with self.assertRaises(rl.Error) as cm:
                    buffer.push_rollouts(ro)
                self.assertIn("is not scored", str(cm.exception))
                ro.score(env)
                info = ro.info()
                self.assertEqual(info.scalars["rollouts"], 12)
                self.assertEqual(info.tensors["group_ids"], [0] * 4 + [1] * 4 + [2] * 4)
                rewards = info.tensors["rewards"]
                self.assertAlmostEqual(info.scalars["reward_mean"], sum(rewards) / 12, places=12)
                # Rewards from elsewhere (a reward model, a judge, shaping).
                shaped = [r - 0.25 * (i % 2) for i, r in enumerate(rewards)]
                ro.set_rewards(shaped)
                self.assertEqual(ro.info().tensors["rewards"], shaped)
                with self.assertRaises(rl.Error) as cm:
                    ro.set_rewards(shaped[:5])
                self.assertIn("got 5 rewards for 12 rollouts", str(cm.exception))
                self.assertEqual(buffer.push_rollouts(ro), 12)
            kept = buffer.stats().scalars["ready_rollouts"]
            for bad in ((-1, 0), (1, -1)):  # before: never enough rollouts, an endless wait
                with self.assertRaises(rl.Error) as cm:
                    buffer.pop_train_batch(*bad)
                self.assertIn("Buffer.pop_train_batch: min_rollouts and timeout_ms must be >= 0",
                              str(cm.exception))
            batch = buffer.pop_train_batch(1)
            if kept == 0:
                self.assertIsNone(batch)
                return
            with batch:
                out = batch.compute_advantages(adv)
                self.assertEqual(len(out.tensors["advantages"]), batch.info().scalars["tokens"])
                r = trainer.forward_backward(batch, loss)
                self.assertIn("loss", r.scalars)
                parts = batch.split(8)
                self.assertEqual(sum(p.info().scalars["rollouts"] for p in parts), kept)
                for p in parts:
                    p.close()
            opt = trainer.optim_step()
            self.assertEqual(engine.sync_weights(buffer), opt.scalars["policy_version"])
            self.assertEqual(buffer.stats().scalars["policy_version"], opt.scalars["policy_version"])

    def test_moe_rollouts_carry_their_routing_into_the_batch(self):
        # R3: sampling.return_routed_experts on the tiny-moe preset.
        with tempfile.TemporaryDirectory(prefix="rl-py-moe-") as tmp:
            rl.init_model("tiny-moe", os.path.join(tmp, "moe"), 3)
            env = self.rt.create("env", "reverse_text")
            tasks = env.sample(2, 5)
            with rl.Model(os.path.join(tmp, "moe"), {"threads": 1}) as model, \
                    model.engine() as engine, model.trainer({"seed": 1}) as trainer:
                with engine.rollouts(tasks, group_offset=0, sampling={
                        "n": 2, "max_tokens": 5, "seed": 4, "return_routed_experts": True}) as ro:
                    routes = ro.routed_experts()
                    info = ro.info()
                    self.assertEqual(len(routes), 4)
                    cu = info.tensors["routed_cu_seqlens"]
                    L, K = int(info.scalars["routed_layers"]), int(info.scalars["routed_k"])
                    with open(os.path.join(tmp, "moe", "config.json")) as f:
                        self.assertEqual(L, json.load(f)["num_hidden_layers"])
                    flat = []
                    for i, r in enumerate(routes):
                        self.assertEqual(len(r), cu[i + 1] - cu[i])
                        self.assertEqual({len(row) for row in r}, {L})
                        self.assertEqual({len(layer) for row in r for layer in row}, {K})
                        self.assertEqual(r[-1], [[-1] * K] * L)  # never read
                        self.assertTrue(all(0 <= e < 8 for row in r[:-1] for layer in row
                                            for e in layer))
                        flat += [e for row in r for layer in row for e in layer]
                    self.assertEqual(info.tensors["routed_experts"], flat)
                    ro.set_rewards([1.0, 0.0, 0.0, 1.0])
                    with ro.to_batch() as batch:
                        b = batch.info()
                        self.assertEqual(b.tensors["routed_experts"], flat)
                        self.assertEqual(len(flat), b.scalars["tokens"] * L * K)
                        out = trainer.forward(batch)  # replays the routing
                        self.assertEqual(len(out.tensors["logprobs"]), b.scalars["tokens"])
        with self.model.engine() as engine:
            with self.assertRaises(rl.Error) as cm:
                engine.rollouts([{"prompt": "ab"}], sampling={"return_routed_experts": True})
            self.assertIn("return_routed_experts", str(cm.exception))

    def test_moe_rollouts_carry_their_routing_weights_into_the_batch(self):
        # R3 with the sampler's mixing weights (sampling.return_expert_logits).
        with tempfile.TemporaryDirectory(prefix="rl-py-moe-w-") as tmp:
            rl.init_model("tiny-moe", os.path.join(tmp, "moe"), 3)
            env = self.rt.create("env", "reverse_text")
            tasks = env.sample(2, 5)
            with open(os.path.join(tmp, "moe", "config.json")) as f:
                normalized = json.load(f).get("norm_topk_prob", False)
            with rl.Model(os.path.join(tmp, "moe"), {"threads": 1}) as model, \
                    model.engine() as engine, model.trainer({"seed": 1}) as trainer:
                with engine.rollouts(tasks, group_offset=0, sampling={
                        "n": 2, "max_tokens": 5, "seed": 4, "return_routed_experts": True,
                        "return_expert_logits": True}) as ro:
                    routes, weights = ro.routed_experts(), ro.routed_expert_weights()
                    self.assertEqual(len(weights), 4)
                    flat = []
                    for r, w in zip(routes, weights):
                        self.assertEqual(len(w), len(r))
                        K = len(w[0][0])
                        self.assertEqual(w[-1], [[0.0] * K] * len(w[-1]))  # never read
                        for row in w[:-1]:
                            for layer in row:
                                self.assertTrue(all(0.0 < x <= 1.0 for x in layer), layer)
                                if normalized:
                                    self.assertAlmostEqual(sum(layer), 1.0, places=5)
                                # the top-k, largest first
                                self.assertEqual(layer, sorted(layer, reverse=True))
                        flat += [x for row in w for layer in row for x in layer]
                    ro.set_rewards([1.0, 0.0, 0.0, 1.0])
                    with ro.to_batch() as batch:
                        b = batch.info()
                        self.assertEqual(len(b.tensors["routed_expert_weights"]), len(flat))
                        for x, y in zip(b.tensors["routed_expert_weights"], flat):
                            self.assertEqual(x, y)
                        # The trainer mixes the replayed experts with them: the
                        # rollouts' own logprobs back at every trained token.
                        out = trainer.forward(batch)
                        old, mask = b.tensors["old_logprobs"], b.tensors["loss_mask"]
                        for lp, o, m in zip(out.tensors["logprobs"], old, mask):
                            if m:
                                self.assertAlmostEqual(lp, o, delta=1e-4)
            with rl.Model(os.path.join(tmp, "moe"), {"threads": 1}) as model, \
                    model.engine() as engine:
                with self.assertRaises(rl.Error) as cm:
                    engine.rollouts(tasks, sampling={"return_expert_logits": True})
                self.assertIn("return_routed_experts", str(cm.exception))

    def test_multi_turn_episodes_and_env_steps(self):
        env = self.rt.create("env", "guess_number", {"lo": 1, "hi": 8, "max_guesses": 3})
        self.assertTrue(env.multi_turn())
        self.assertFalse(self.rt.create("env", "reverse_text").multi_turn())
        task = {"prompt": "guess\n", "answer": "6", "metadata": {"secret": 6}}
        r = env.step(task, "null", "2\n")
        self.assertEqual(r.scalars["done"], 0)
        self.assertEqual(r.texts["observation"], "higher\n")
        r = env.step(task, r.texts["state"], "6")
        self.assertEqual((r.scalars["done"], r.scalars["reward"]), (1, 0.8))
        with self.model.engine() as engine:
            engine.sync_weights()
            with engine.episodes(env, env.sample(2, 4), max_turns=3,
                                 sampling={"n": 3, "max_tokens": 3, "seed": 5}) as eps:
                info = eps.info()
                self.assertEqual(info.scalars["rollouts"], 6)
                turns = info.tensors["turns"]
                self.assertTrue(all(1 <= t <= 3 for t in turns), turns)
                per_turn = json.loads(info.texts["turn_rewards"])
                self.assertEqual([len(x) for x in per_turn], turns)
                self.assertEqual(info.tensors["rewards"], [sum(x) for x in per_turn])
                with self.assertRaises(rl.Error) as cm:
                    eps.score(env)
                self.assertIn("multi-turn episodes", str(cm.exception))

    def test_errors_carry_status_and_name_the_argument(self):
        with self.assertRaises(rl.Error) as cm:
            rl.Model("/nonexistent/model")
        self.assertIn("/nonexistent/model", str(cm.exception))
        with self.assertRaises(rl.Error) as cm:
            self.model.trainer({"learning_rate": -1})
        self.assertEqual(cm.exception.status, "RL_ERR_INVALID_ARG")
        self.assertIn("'trainer.learning_rate' must be >= 0", str(cm.exception))
        with self.model.engine() as engine:
            with self.assertRaises(rl.Error) as cm:
                engine.rollouts([{"question": "x"}])
            self.assertIn("tasks[0] has no string 'prompt'", str(cm.exception))
        with self.assertRaises(rl.Error) as cm:
            rl.Buffer({"group_sise": 2})
        self.assertIn("'buffer.group_sise'", str(cm.exception))
        cfg = rl.config_load(None, ["ppo.epochs=0"])
        with self.assertRaises(rl.Error) as cm:
            rl.config_declare(cfg, [{"key": "ppo.epochs", "type": "integer", "default": 2,
                                     "min": 1}])
        self.assertIn("key 'ppo.epochs' must be >= 1, got 0", str(cm.exception))

    def test_closing_a_model_closes_its_trainers_and_engines(self):
        model = rl.Model(Tiny.path(), {"threads": 1})
        trainer, engine = model.trainer(), model.engine()
        model.close()
        with self.assertRaises(rl.Error) as cm:
            trainer.optim_step()
        self.assertIn("Trainer is closed", str(cm.exception))
        with self.assertRaises(rl.Error):
            engine.sync_weights()


@unittest.skipUnless(RLHOST and SOURCE, "RL_TEST_RLHOST / RL_TEST_SOURCE_DIR not set")
class ExampleTest(unittest.TestCase):
    def test_python_grpo_example_equals_the_lua_one_step_for_step(self):
        config = os.path.join(SOURCE, "tests", "lua", "scripts", "grpo_test.yaml")
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(os.environ, RL_PLUGIN_PATH=PLUGINS)
            lua = subprocess.run([RLHOST, "run", os.path.join(SOURCE, "examples", "grpo.lua"),
                                  "--config", config], cwd=tmp, env=env, capture_output=True,
                                 text=True, timeout=600)
            self.assertEqual(lua.returncode, 0, lua.stderr)
            py_metrics = os.path.join(tmp, "py.jsonl")
            py = subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "grpo.py"),
                                 "--config", config, "--plugin-path", PLUGINS,
                                 "--set", "run.name=grpo_py", "--metrics", py_metrics],
                                cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
            self.assertEqual(py.returncode, 0, py.stderr)
            with open(os.path.join(tmp, "runs", "grpo_test", "metrics.jsonl")) as f:
                lua_lines = [json.loads(line) for line in f]
            with open(py_metrics) as f:
                py_lines = [json.loads(line) for line in f]
        self.assertEqual(len(py_lines), len(lua_lines))
        rl_steps = 0
        for a, b in zip(lua_lines, py_lines):
            self.assertEqual((a["phase"], a["step"]), (b["phase"], b["step"]))
            for key in ("reward", "loss", "grad_norm", "tokens", "dropped_groups"):
                self.assertEqual(a.get(key), b.get(key), f"{a['phase']} step {a['step']}: {key}")
            rl_steps += a["phase"] == "rl"
        self.assertGreater(rl_steps, 10)


if __name__ == "__main__":
    unittest.main()
