"""Every loss plugin the build ships, found from its definition (the plugin
folder), gets the generic checks for every aggregation mode it accepts, with
and without the KL and entropy terms: finite gradients, zero on tokens outside
the loss mask, and equal to central finite differences of the loss value
unless the plugin declares the "stop-gradient" feature (a surrogate with
detached factors, checked against its formulas in tests/losses). A new loss is
covered by adding its folder."""

import math
import os
import unittest

import rl

PLUGINS = os.environ["RL_TEST_PLUGIN_DIR"]
CU = [0, 3, 7]  # two sequences
N = CU[-1]
MODES = [{"loss_agg_mode": "token-mean"}, {"loss_agg_mode": "seq-mean-token-sum"},
         {"loss_agg_mode": "seq-mean-token-mean"},
         {"loss_agg_mode": "seq-mean-token-sum-norm", "max_seq_len": 8},
         {"loss_agg_mode": "sum"}]
REGULARIZED = {"kl_coef": 0.1, "entropy_coef": 0.01}


def inputs_for(names):
    """Smooth, generic per-token inputs by name (ratios near 1, away from clip edges)."""
    lp = [-1.2, -0.7, -2.1, -0.4, -1.6, -0.9, -1.1]
    values = {
        "logprobs": lp,
        "old_logprobs": [x + d for x, d in zip(lp, [0.01, -0.02, 0.015, -0.01, 0.02, -0.015, 0.005])],
        "prox_logprobs": [x + d for x, d in zip(lp, [0.005, -0.01, 0.01, 0.0, 0.01, -0.005, 0.0])],
        "ref_logprobs": [x + d for x, d in zip(lp, [0.3, -0.2, 0.1, 0.25, -0.3, 0.15, -0.1])],
        "teacher_logprobs": [x + d for x, d in zip(lp, [0.2, 0.1, -0.3, 0.05, 0.1, -0.2, 0.3])],
        "advantages": [0.8, -0.5, 1.2, -1.1, 0.3, 0.6, -0.2],
        "entropy": [1.5, 0.9, 2.0, 1.1, 0.7, 1.3, 1.8],
        "values": [0.2, -0.1, 0.4, 0.0, 0.3, -0.2, 0.1],
        "old_values": [0.25, -0.05, 0.35, 0.02, 0.28, -0.18, 0.12],
        "returns": [0.5, 0.1, 0.2, -0.3, 0.6, 0.0, 0.4],
        "labels": [5, 6, 7, 8, 9, 10, 11],
        "loss_mask": [0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0],
        "rl_weights": [1.0, 0.5, 1.5, 1.0, 0.0, 1.0, 2.0],
        "ce_weights": [0.0, 1.0, 0.0, 0.5, 1.0, 1.0, 0.0],
        "ref_kl_weights": [1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0],
        "rollout_is_weights": [1.0, 0.9, 1.2, 0.7, 1.1, 1.0, 0.8],
        "weights": [1.0, 1.5, 0.5, 1.0, 2.0, 1.0, 0.0],
    }
    missing = [n for n in names if n not in values]
    if missing:
        raise AssertionError(f"no generic values for input(s) {missing}; add them to inputs_for()")
    return {n: list(values[n]) for n in names}


class LossDiscoveryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.rt = rl.Runtime(plugin_path=PLUGINS, default_plugins=False)
        plugins = [p for p in cls.rt.plugins()["plugins"] if p["kind"] == "loss"]
        cls.losses = sorted(p["name"] for p in plugins)
        cls.surrogate = {p["name"] for p in plugins if "stop-gradient" in (p.get("features") or [])}

    @classmethod
    def tearDownClass(cls):
        cls.rt.close()

    def test_the_build_ships_loss_plugins(self):
        self.assertGreaterEqual(len(self.losses), 10, self.losses)
        self.assertEqual(self.surrogate, {"cispo", "grpo", "dppo", "ipo"})

    def configurations(self, name):
        """Parameter sets the plugin accepts: each aggregation mode, with and without regularizers."""
        out = []
        for mode in MODES:
            for extra in ({}, REGULARIZED):
                params = dict(mode, **extra)
                try:
                    out.append((params, self.rt.create("loss", name, params)))
                except rl.Error as e:
                    if "unknown parameter" not in str(e):
                        raise
        if not out:  # a loss without the toolkit's parameters: its defaults
            out.append(({}, self.rt.create("loss", name)))
        return out

    def test_gradients_equal_finite_differences_for_every_configuration(self):
        for name in self.losses:
            configs = self.configurations(name)
            for params, loss in configs:
                sig = loss.signature()
                x = inputs_for(sig["required"] + [n for n in sig["optional"]])
                out = loss.compute(x, CU)
                for d in sig["differentiable"]:
                    grad = out.tensors[f"grad.{d}"]
                    for i in range(N):
                        with self.subTest(loss=name, params=params, input=d, token=i):
                            self.assertTrue(math.isfinite(grad[i]))
                            if x["loss_mask"][i] == 0:
                                self.assertEqual(grad[i], 0.0)
                    if name in self.surrogate:
                        continue
                    for i in range(N):
                        h = 1e-6
                        up, down = dict(x), dict(x)
                        up[d] = list(x[d]); up[d][i] += h
                        down[d] = list(x[d]); down[d][i] -= h
                        fd = (loss.compute(up, CU, want_grads=False).scalars["loss"] -
                              loss.compute(down, CU, want_grads=False).scalars["loss"]) / (2 * h)
                        with self.subTest(loss=name, params=params, input=d, token=i):
                            self.assertTrue(math.isclose(grad[i], fd, rel_tol=1e-4, abs_tol=1e-6),
                                            f"analytic {grad[i]!r} vs finite difference {fd!r}")
                loss.close()
            with self.subTest(loss=name):
                if any("loss_agg_mode" in p for p, _ in configs):
                    self.assertEqual(len({p["loss_agg_mode"] for p, _ in configs}), len(MODES))


if __name__ == "__main__":
    unittest.main()
