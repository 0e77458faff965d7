"""The multi-turn example (examples/agent.lua on guess_number) end to end:
the warm-up plays reference episodes against the env, every RL step's
episodes are logged with their turns, the trained samples hold the env's
answers between the model's turns, and a multi-turn run refuses an inference
server (episodes need the co-located engine). The tool-use example
(examples/agent_tools.yaml, the calculator) learns: after a warm-up in which
half of the reference episodes answer without the tool, RL makes the model
call the tool and the reward rises by a margin."""

import json
import os
import subprocess
import tempfile
import unittest

RLHOST = os.environ["RL_TEST_RLHOST"]
SOURCE = os.environ["RL_TEST_SOURCE_DIR"]


class AgentBase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="rl-agent-")
        self.run_dir = os.path.join(self.tmp.name, "runs", "agent")

    def tearDown(self):
        self.tmp.cleanup()

    def rlhost_run(self, *sets, config="examples/agent.yaml"):
        args = [RLHOST, "run", "examples/agent.lua", "--config", config,
                "--set", "run.progress=lines", "--set", "run.tensorboard=false",
                "--set", f"run.dir={self.tmp.name}/runs",
                "--set", f"model.init_dir={self.tmp.name}/tiny"]
        for s in sets:
            args += ["--set", s]
        return subprocess.run(args, cwd=SOURCE, capture_output=True, text=True, timeout=600)


class AgentRun(AgentBase):
    def test_episodes_are_logged_with_their_turns_and_trained_with_the_envs_answers(self):
        p = self.rlhost_run("sft.steps=20", "run.steps=6", "run.samples_every=1")
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        sft = [r for r in recs if r["phase"] == "sft"]
        rl_steps = [r for r in recs if r["phase"] == "rl"]
        self.assertEqual(len(sft), 20)
        self.assertLess(sft[-1]["loss"], sft[0]["loss"])
        self.assertEqual(len(rl_steps), 6)
        for r in rl_steps:
            self.assertTrue(1 <= r["turns"] <= 4, r)
            self.assertEqual(r["episode_errors"], 0)
            self.assertTrue(0 <= r["solved"] <= 1, r)
        self.assertTrue(any("grad_norm" in r for r in rl_steps), "no step trained")
        with open(os.path.join(self.run_dir, "samples.jsonl")) as f:
            samples = [json.loads(line) for line in f if line.strip()]
        self.assertTrue(samples)
        answered = [s for s in samples if "higher\n" in s["completion"] or "lower\n" in s["completion"]]
        self.assertTrue(answered, "no trained episode holds an answer of the env")

    def test_an_inference_server_is_refused_naming_the_reason(self):
        p = self.rlhost_run("sft.steps=0", "run.steps=1",
                            "inference_server.url=http://127.0.0.1:9")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("multi-turn episodes need the co-located engine", p.stderr + p.stdout)


class ToolUseLearns(AgentBase):
    def setUp(self):
        super().setUp()
        self.run_dir = os.path.join(self.tmp.name, "runs", "agent_tools")

    def test_rl_makes_the_model_call_the_calculator_and_the_reward_rises(self):
        steps = 20
        p = self.rlhost_run(f"run.steps={steps}", "eval.every=0", "run.checkpoint_every=0",
                            config="examples/agent_tools.yaml")
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        rl_steps = [r for r in recs if r["phase"] == "rl"]
        self.assertEqual(len(rl_steps), steps)

        def mean(key, rs):
            return sum(r[key] for r in rs) / len(rs)

        first, last = rl_steps[:5], rl_steps[-5:]
        summary = " ".join(f"{r['reward']:.2f}/{r['env/tool_calls']:.2f}" for r in rl_steps)
        # The warm-up leaves the tool to about half of the episodes; RL raises
        # that, and the reward with it.
        self.assertGreater(mean("env/tool_calls", last), mean("env/tool_calls", first) + 0.1,
                           summary)
        self.assertGreater(mean("reward", last), mean("reward", first) + 0.15, summary)
        for r in rl_steps:
            self.assertEqual(r["episode_errors"], 0, r)


if __name__ == "__main__":
    unittest.main()
