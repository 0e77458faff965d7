"""Python embeds the runtime through the C ABI: same numbers, same errors."""

import json
import os
import unittest

import rl

FIXTURES = os.environ["RL_TEST_FIXTURE_DIR"]
PLUGINS = os.environ["RL_TEST_PLUGIN_DIR"]


def fixture(name):
    return os.path.join(FIXTURES, name + ".so")


class EmbeddingTest(unittest.TestCase):
    def test_plain_c_loss_gives_loss_gradients_and_metrics(self):
        with rl.Runtime(plugin_path=fixture("fixture_plain_c"), default_plugins=False) as rt:
            loss = rt.create("loss", "my_c_loss")
            out = loss.compute({"logprobs": [-1.0, -2.0, -0.5], "advantages": [1.0, -1.0, 2.0]},
                               cu_seqlens=[0, 3])
            self.assertAlmostEqual(out.scalars["loss"], -(-1.0 + 2.0 - 1.0) / 3.0)
            self.assertEqual(out.metrics["n_tokens"], 3.0)
            self.assertEqual(out.tensors["grad.logprobs"], [-1 / 3, 1 / 3, -2 / 3])
            self.assertEqual(loss.signature()["differentiable"], ["logprobs"])

    def test_versions_name_the_plugin_abi_and_the_embedder_api_apart(self):
        v = rl.versions()
        self.assertRegex(v["librl"], r"^\d+\.\d+\.\d+$")
        # The plugin ABI a loaded plugin reports is the host's plugin ABI, not the API's.
        with rl.Runtime(plugin_path=fixture("fixture_plain_c"), default_plugins=False) as rt:
            self.assertEqual(rt.plugins()["plugins"][0]["abi_version"], v["plugin_abi"])
        self.assertEqual(v["plugin_abi"], "0.10.0")
        self.assertEqual(v["api"], "0.12.0")

    def test_errors_carry_status_and_message(self):
        with rl.Runtime(plugin_path=fixture("fixture_good"), default_plugins=False) as rt:
            with self.assertRaises(rl.Error) as cm:
                rt.create("loss", "fixture_sum", {"scael": 1})
            self.assertEqual(cm.exception.status, "RL_ERR_INVALID_ARG")
            self.assertIn("unknown parameter 'scael'", str(cm.exception))
            with self.assertRaises(rl.Error) as cm:
                rt.create("loss", "nope")
            self.assertEqual(cm.exception.status, "RL_ERR_NOT_FOUND")

    def test_refusals_are_listed_with_reasons(self):
        with rl.Runtime(plugin_path=FIXTURES, default_plugins=False) as rt:
            listing = rt.plugins()
            reasons = {os.path.basename(r["path"]): r["reason"] for r in listing["refused"]}
            self.assertIn("incompatible with the host's ABI version 0.10.0",
                          reasons["fixture_broken_wrong_major.so"])
            self.assertIn("missing the entry symbol", reasons["fixture_broken_no_entry.so"])

    def test_filter_verdict_and_host_enforce(self):
        with rl.Runtime(plugin_path=fixture("fixture_good"), default_plugins=False) as rt:
            f = rt.create("filter", "fixture_length", {"max_len": 2, "enforce": True})
            out = f.check([1, 2, 3], [-0.1, -0.2, -0.3], vocab_size=10)
            self.assertEqual(out.scalars["flagged"], 1.0)
            self.assertEqual(out.scalars["enforce"], 1.0)
            self.assertEqual(out.texts["reason"], "too_long")
            self.assertEqual(f.check([1], [-0.1], vocab_size=10).scalars["flagged"], 0.0)

    @unittest.skipUnless(os.path.exists(os.path.join(PLUGINS, "rl-env-reverse_text.so")),
                         "reverse_text plugin not built")
    def test_env_sampling_is_deterministic_and_scores_its_own_answers(self):
        with rl.Runtime(plugin_path=PLUGINS, default_plugins=False) as rt:
            env = rt.create("env", "reverse_text")
            a, b = env.sample(4, seed=7), env.sample(4, seed=7)
            self.assertEqual(a, b)
            for task in a:
                self.assertEqual(env.score(task, task["answer"]).scalars["reward"], 1.0)
            with self.assertRaises(rl.Error) as cm:  # before: built tasks until killed
                env.sample(-1)
            self.assertIn("env.sample: n and seed must be >= 0 (n -1, seed 0)", str(cm.exception))

    def test_config_load_reports_file_key_and_line(self):
        cfg = rl.config_load(None, ["run.steps=3"])
        self.assertEqual(cfg["run"]["steps"], 3)
        with self.assertRaises(rl.Error) as cm:
            rl.config_load(None, ["run.stepz=3"])
        self.assertIn("unknown key 'run.stepz'", str(cm.exception))
        keys = {k["key"] for k in rl.config_schema()}
        self.assertIn("trainer.learning_rate", keys)


if __name__ == "__main__":
    unittest.main()
