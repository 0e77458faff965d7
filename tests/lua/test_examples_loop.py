"""What every example's loop offers besides training, end to end:

- online evaluation (eval.every): ppo, distill, agent and the disaggregated
  trainer log eval/* on exactly the steps that are multiples of eval.every;
- the GRPO example on the MoE preset logs the router's aux loss and the
  experts' load ratios, and trains with routing replay (moe.routing_replay,
  moe.routing_replay_weights), also with the experts split over two ranks
  (trainer.expert_parallel); a dense model refuses routing replay, the weights
  without the ids are refused; the multi-turn agent example trains with
  routing replay on the MoE preset (its episodes carry their routing);
- the disaggregated trainer's frozen reference (ref.model): every trained
  batch gets ref_logprobs, ref_kl is 0 on the first step (the batch of the
  initial weights, scored by the initial weights) and above 0 once the policy
  moved; the reference folder is the trainer's."""

import os
import subprocess
import unittest

from rlhost_runs import RLHOST, RunFolderCase, read_records, rlhost_run

EVAL = ["eval.every=2", "eval.tasks=4"]


class ExampleLoops(RunFolderCase):
    RUN = "loops"

    def rlhost_run(self, script, config, name, sets, launch=(), timeout=900):
        return rlhost_run(self.tmp.name, script, config,
                          ["run.tensorboard=false", f"run.name={name}"] + sets, launch=launch,
                          timeout=timeout)

    def run_example(self, script, config, name, sets, launch=()):
        p = self.rlhost_run(script, config, name, sets, launch=launch)
        self.assertEqual(p.returncode, 0, p.stdout[-3000:] + p.stderr[-3000:])
        return read_records(os.path.join(self.tmp.name, "runs", name), "rl")

    def trained_on_moe(self, script, config, name, sets, launch=()):
        """The records of the steps that trained in a run of the example on the
        tiny-moe preset (at least one)."""
        recs = self.run_example(script, config, name, ["model.preset=tiny-moe",
                                                       f"model.init_dir={self.tmp.name}/moe"] + sets,
                                launch=launch)
        trained = [r for r in recs if "grad_norm" in r]
        self.assertTrue(trained, recs)
        return trained

    def expect_eval_on_even_steps(self, recs, steps):
        self.assertEqual([r["step"] for r in recs], list(range(1, steps + 1)))
        for r in recs:
            if r["step"] % 2 == 0:
                self.assertIn("eval/reward_mean", r)
                self.assertEqual(r["eval/tasks"], 4)
                self.assertTrue(0 <= r["eval/pass_at_k"] <= 1, r)
            else:
                self.assertNotIn("eval/reward_mean", r)

    def test_ppo_evaluates_online(self):
        recs = self.run_example("examples/ppo.lua", "examples/ppo.yaml", "ppo",
                                ["sft.steps=2", "run.steps=2"] + EVAL)
        self.expect_eval_on_even_steps(recs, 2)

    def test_distill_evaluates_online(self):
        teacher = os.path.join(self.tmp.name, "teacher")
        p = subprocess.run([RLHOST, "init-model", "--preset", "tiny", "--out", teacher],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        recs = self.run_example("examples/distill.lua", "examples/distill.yaml", "distill",
                                [f"distill.teacher_path={teacher}", 'model.path=""', "run.steps=2"] + EVAL)
        self.expect_eval_on_even_steps(recs, 2)

    def test_agent_evaluates_episodes_online(self):
        recs = self.run_example("examples/agent.lua", "examples/agent.yaml", "agent",
                                ["sft.steps=2", "run.steps=2"] + EVAL)
        self.expect_eval_on_even_steps(recs, 2)

    def test_grpo_on_the_moe_preset_logs_the_router(self):
        trained = self.trained_on_moe("examples/grpo.lua", "examples/grpo.yaml", "moe",
                                      ["sft.steps=2", "run.steps=2", "buffer.min_rollouts=8"])
        for r in trained:
            self.assertGreater(r["moe/aux_loss"], 0.0)
            self.assertGreaterEqual(r["moe/max_load_ratio"], 1.0)
            self.assertLessEqual(r["moe/min_load_ratio"], 1.0)
            self.assertIn("moe/max_load_ratio/layer_0", r)

    def test_grpo_replays_the_rollouts_routing_on_the_moe_preset(self):
        # moe.routing_replay: rollouts record their routing, the batches carry
        # it (routed_experts) and the trainer replays it; with
        # moe.routing_replay_weights the mixing weights as well
        # (routed_expert_weights; tests/moe/moe_rollouts_test checks the values).
        trained = self.trained_on_moe("examples/grpo.lua", "examples/grpo.yaml", "moe_r3",
                                      ["moe.routing_replay=true", "moe.routing_replay_weights=true",
                                       "sft.steps=0", "run.steps=2", "buffer.min_rollouts=8"])
        for r in trained:
            self.assertGreater(r["moe/aux_loss"], 0.0)
        # The weights without the ids are refused, naming both keys.
        p = self.rlhost_run("examples/grpo.lua", "examples/grpo.yaml", "moe_r3_weights_only",
                            ["sft.steps=0", "model.preset=tiny-moe",
                             f"model.init_dir={self.tmp.name}/moe",
                             "moe.routing_replay_weights=true"], timeout=600)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("moe.routing_replay_weights", p.stdout + p.stderr)
        self.assertIn("moe.routing_replay: true", p.stdout + p.stderr)
        # A dense model refuses it, naming the option.
        p = self.rlhost_run("examples/grpo.lua", "examples/grpo.yaml", "dense_r3",
                            ["sft.steps=0", "moe.routing_replay=true"], timeout=600)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("return_routed_experts", p.stdout + p.stderr)

    def test_grpo_on_two_ranks_splits_the_experts_and_replays_the_routing(self):
        # docs/moe.md's worked example: trainer.expert_parallel over the two
        # ranks of `rlhost launch`, with routing replay of ids and weights.
        launch = ["launch", "--nproc-per-node", "2", "--"]
        trained = self.trained_on_moe(
            "examples/grpo.lua", "examples/grpo.yaml", "moe_ep",
            ["trainer.expert_parallel=2", "moe.routing_replay=true",
             "moe.routing_replay_weights=true", "sft.steps=0", "run.steps=2",
             "buffer.min_rollouts=8"], launch=launch)
        for r in trained:
            self.assertGreater(r["moe/aux_loss"], 0.0)
        # The key reaches the trainer: a split the ranks cannot make is refused.
        p = self.rlhost_run("examples/grpo.lua", "examples/grpo.yaml", "moe_ep3",
                            ["sft.steps=0", "model.preset=tiny-moe",
                             f"model.init_dir={self.tmp.name}/moe", "trainer.expert_parallel=3"],
                            launch=launch, timeout=600)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("trainer.expert_parallel (3)", p.stdout + p.stderr)

    def test_agent_replays_the_episodes_routing_on_the_moe_preset(self):
        # moe.routing_replay on a multi-turn env: every episode records the
        # routing of its whole sequence, the batches carry it and the trainer
        # replays it (tests/moe/moe_rollouts_test checks the values).
        trained = self.trained_on_moe("examples/agent.lua", "examples/agent.yaml", "agent_r3",
                                      ["moe.routing_replay=true", "sft.steps=2", "run.steps=2"])
        for r in trained:
            self.assertEqual(r["episode_errors"], 0)

    def test_disaggregated_trainer_scores_a_reference_and_evaluates(self):
        recs = self.run_example(
            "examples/grpo_disaggregated.lua", "tests/lua/scripts/grpo_test.yaml", "disagg",
            ["run.steps=4", "rollout_transport.type=filesystem",
             "weight_broadcast.type=filesystem", "max_async_level=0", "loss.name=policy_loss",
             "loss.params={kl_coef: 0.05}", "ref.model=initial"] + EVAL,
            launch=["launch", "--roles", "trainer,rollout", "--"])
        self.expect_eval_on_even_steps(recs, 4)
        self.assertTrue(os.path.exists(
            os.path.join(self.tmp.name, "runs", "disagg", "reference", "config.json")))
        for r in recs:
            self.assertIn("ref_kl", r)
        self.assertEqual(recs[0]["ref_kl"], 0.0)  # on-policy batch of the initial weights
        self.assertGreater(recs[-1]["ref_kl"], 0.0)


if __name__ == "__main__":
    unittest.main()
