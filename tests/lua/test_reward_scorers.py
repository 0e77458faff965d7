"""Rewards from models in the GRPO example (rl/reward.lua), end to end: a
reward model's score is each rollout's reward (checked against the same
reward model run through the Python bindings), an LLM judge's parsed verdict
is added to the env's reward (the judge in process, and behind `rlhost
serve`), a judge whose replies hold no score gives
judge.invalid_reward and judge/invalid_frac, and bad settings (a causal LM as
the reward model, a label past the head, a judge server that never answers)
stop the run with errors that name them."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from rlhost_runs import RLHOST, SOURCE, read_records, rlhost_run

sys.path.insert(0, os.path.join(SOURCE, "sdk", "python"))
import rl  # noqa: E402  (librl through RL_LIBRARY)


class RewardScorers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="rl-scorers-")
        cls.rm = os.path.join(cls.tmp.name, "rm")
        p = subprocess.run([RLHOST, "init-model", "--preset", "tiny-reward", "--out", cls.rm,
                            "--seed", "3"], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_grpo(self, name, *sets, timeout=600):
        return rlhost_run(self.tmp.name, "examples/grpo.lua", "examples/grpo.yaml",
                          ("run.tensorboard=false", f"run.name={name}", "sft.steps=5") + sets,
                          timeout=timeout)

    def records(self, name):
        return read_records(os.path.join(self.tmp.name, "runs", name), "rl")

    def test_reward_model_scores_are_the_rewards(self):
        p = self.run_grpo("rm", "run.steps=2", "run.samples_every=1",
                          f"reward_model.path={self.rm}", "reward.env_weight=0")
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        recs = self.records("rm")
        self.assertEqual(len(recs), 2)
        for r in recs:
            self.assertAlmostEqual(r["reward"], r["reward_model/score_mean"], places=9)
            self.assertIn("env_reward_mean", r)
        with open(os.path.join(self.tmp.name, "runs", "rm", "samples.jsonl")) as f:
            samples = [json.loads(line) for line in f if line.strip()]
        # The same reward model through the Python bindings, one conversation at a time.
        checked = 0
        with rl.Runtime(default_plugins=False):
            model = rl.Model(self.rm, {"threads": 1})
            scorer = model.trainer({"forward_only": True})
            for s in samples:
                if "\\x" in s["completion"]:
                    continue  # bytes that are not UTF-8 were escaped in the log
                ids, _ = model.encode_chat([{"role": "user", "content": s["task"]["prompt"]},
                                            {"role": "assistant", "content": s["completion"]}],
                                           add_generation_prompt=False)
                out = scorer.forward({"input_ids": ids, "cu_seqlens": [0, len(ids)]})
                self.assertAlmostEqual(s["reward"], out.tensors["scores"][0], delta=1e-4,
                                       msg=json.dumps(s))
                checked += 1
        self.assertGreater(checked, 10)

    def test_judge_verdicts_add_to_the_env_reward(self):
        judge = os.path.join(self.tmp.name, "judge")
        p = subprocess.run([RLHOST, "run", "tests/lua/scripts/train_judge.lua", "--", judge],
                           cwd=SOURCE, capture_output=True, text=True, timeout=600)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        p = self.run_grpo("judge", "run.steps=2", f"judge.model={judge}")
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        for r in self.records("judge"):
            # The judge replies "Score: 7" on the 0..10 rubric: 0.7 each.
            self.assertEqual(r["judge/invalid_frac"], 0.0)
            self.assertAlmostEqual(r["judge/score_mean"], 0.7, places=9)
            self.assertAlmostEqual(r["reward"], r["env_reward_mean"] + 0.7, places=9)
        # The same judge behind `rlhost serve` (judge.url, the SGLang-native routes).
        server = subprocess.Popen([RLHOST, "serve", "--model", judge, "--port", "0",
                                   "--threads", "1"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            match = re.search(r"listening on (http://\S+)", line)
            self.assertTrue(match, line + server.stderr.read() if not match else "")
            p = self.run_grpo("judge_served", "run.steps=2", f"judge.model={judge}",
                              f"judge.url={match.group(1)}")
            self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
            for r in self.records("judge_served"):
                self.assertEqual(r["judge/invalid_frac"], 0.0)
                self.assertAlmostEqual(r["judge/score_mean"], 0.7, places=9)
                self.assertAlmostEqual(r["reward"], r["env_reward_mean"] + 0.7, places=9)
        finally:
            server.send_signal(signal.SIGINT)
            _, err = server.communicate(timeout=60)
            self.assertEqual(server.returncode, 0, err)

    def test_replies_without_a_score_get_the_invalid_reward(self):
        # The untrained tiny model as the judge: its replies hold no "Score: N".
        p = self.run_grpo("nojudge", "run.steps=1", f"judge.model={self.tmp.name}/tiny",
                          "judge.invalid_reward=-0.5", "judge.max_tokens=16")
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        (r,) = self.records("nojudge")
        self.assertEqual(r["judge/invalid_frac"], 1.0)
        self.assertNotIn("judge/score_mean", r)
        self.assertAlmostEqual(r["reward"], r["env_reward_mean"] - 0.5, places=9)

    def test_judge_scores_parse_as_documented(self):
        p = subprocess.run([RLHOST, "run", "tests/lua/scripts/judge_score.lua"], cwd=SOURCE,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("judge_score: ok", p.stdout)

    def test_bad_settings_are_refused_naming_them(self):
        p = self.run_grpo("bad1", "run.steps=1", f"reward_model.path={self.tmp.name}/tiny")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("is a Qwen3ForCausalLM, not a reward model", p.stderr)
        p = self.run_grpo("bad2", "run.steps=1", f"reward_model.path={self.rm}",
                          "reward_model.label=1")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("reward_model.label: 1, but", p.stderr)
        p = self.run_grpo("bad3", "run.steps=1", f"judge.model={self.tmp.name}/none")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("judge.model: '" + self.tmp.name + "/none' is not a model folder", p.stderr)

    def test_a_judge_server_that_never_answers_stops_the_run_naming_it(self):
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        held = []

        def accept():
            try:
                while True:
                    conn, _ = srv.accept()
                    held.append(conn)  # read nothing, answer nothing
            except OSError:
                pass

        threading.Thread(target=accept, daemon=True).start()
        try:
            start = time.time()
            p = self.run_grpo("silent", "run.steps=1", f"judge.model={self.tmp.name}/tiny",
                              f"judge.url=http://127.0.0.1:{port}", "judge.timeout=2",
                              timeout=300)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(f"judge (http://127.0.0.1:{port})", p.stderr)
            self.assertLess(time.time() - start, 240)
        finally:
            srv.close()
            for c in held:
                c.close()


if __name__ == "__main__":
    unittest.main()
