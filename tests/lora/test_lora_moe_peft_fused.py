"""PEFT's fused-expert adapters in rl (docs/lora.md, "Mixture-of-experts
models"): an adapter that PEFT itself makes over transformers 5's fused expert
parameters (target_parameters mlp.experts.gate_up_proj / down_proj, random
weights, nothing trained) on a random tiny Qwen3-MoE (and Qwen2-MoE with its
shared expert), saved by PEFT, loads into rl's per-expert pairs and gives
PEFT's logprobs; our merged export gives the logprobs of PEFT's merge. The
fused form PEFT writes when it re-saves a per-expert adapter (gate_up_proj at
rank 2r, block-diagonal) loads too; what per-expert pairs cannot hold is
refused naming the key. Skips (77) without transformers / peft."""

import json
import os
import tempfile
import unittest

from hf_util import hf_logprobs, import_or_skip, random_model

torch, transformers, peft, safetensors = import_or_skip(
    "torch", "transformers", "peft", "safetensors")
import rl
from test_lora_moe_peft import (SEQS, TOL, LogprobsCase, batch_of, load_merged,
                                qwen2_moe_config, qwen3_moe_config, train_and_save)

PLUGINS = os.environ["RL_TEST_PLUGIN_DIR"]
FUSED = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def peft_fused(hf, seed, r=3, alpha=5, target_modules=("q_proj", "v_proj", "o_proj"),
               target_parameters=FUSED, **extra):
    """PEFT's LoRA on `hf` (in place) with every A and B drawn at random."""
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=list(target_modules),
                          target_parameters=list(target_parameters), init_lora_weights=False,
                          **extra)
    pm = peft.get_peft_model(hf, cfg).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_A" in n or "lora_B" in n:
                p.normal_(0.0, 0.15)
    return pm


def our_logprobs(model, name, directory):
    model.load_adapter(name, directory)
    trainer = model.trainer({"adapter": name})
    batch, cu = batch_of(SEQS)
    return trainer.forward(batch).tensors["logprobs"], cu


def expert_lora(pm):
    return [p for n, p in pm.named_parameters() if ".experts." in n and "lora_B" in n]


class FusedPeftTest(LogprobsCase):
    def assert_experts_matter(self, ours, cu, pm):
        # Without the expert pairs PEFT's logprobs move away from ours.
        lora = expert_lora(pm)
        self.assertTrue(lora, "PEFT put no adapter on the experts")
        saved = [p.detach().clone() for p in lora]
        with torch.no_grad():
            for p in lora:
                p.zero_()
        moved = max(abs(ours[cu[0] + t] - b) for t, b in enumerate(hf_logprobs(pm, SEQS[0])))
        with torch.no_grad():
            for p, v in zip(lora, saved):
                p.copy_(v)
        self.assertGreater(moved, 1e-4, "the expert adapters changed nothing")

    def test_qwen3_moe_fused_adapter_made_by_peft_gives_peft_logprobs_and_merge(self):
        with tempfile.TemporaryDirectory() as d:
            hf = random_model(qwen3_moe_config(), 7)
            base = os.path.join(d, "hf")
            hf.save_pretrained(base)
            plain = hf_logprobs(hf, SEQS[0])
            pm = peft_fused(hf, 8)
            adapter_dir = os.path.join(d, "adapter")
            pm.save_pretrained(adapter_dir)
            with safetensors.safe_open(
                    os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
                keys = set(f.keys())
            # PEFT's fused layout: gate_up_proj's wrapper is down_proj's base layer.
            self.assertIn("base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight",
                          keys)
            self.assertIn("base_model.model.model.layers.3.mlp.experts.lora_A.weight", keys)
            self.assertFalse(any(".experts.0." in k for k in keys))

            model = rl.Model(base, {"threads": 1})
            ours, cu = our_logprobs(model, "fused", adapter_dir)
            self.assertGreater(max(abs(ours[t] - b) for t, b in enumerate(plain)), 1e-3)
            self.assert_matches(ours, cu, pm, "with PEFT's fused adapter")
            self.assert_experts_matter(ours, cu, pm)

            # Saved again by rl: PEFT's per-expert keys.
            resaved = os.path.join(d, "ours")
            model.save_adapter("fused", resaved)
            with safetensors.safe_open(
                    os.path.join(resaved, "adapter_model.safetensors"), "pt") as f:
                self.assertIn("base_model.model.model.layers.1.mlp.experts.5.up_proj"
                              ".lora_B.weight", set(f.keys()))

            merged_dir = os.path.join(d, "merged")
            model.export_merged("fused", merged_dir)
            merged = load_merged(merged_dir)
            peft_merged = pm.merge_and_unload().eval()
            for i, s in enumerate(SEQS):
                want = hf_logprobs(peft_merged, s)
                for t, b in enumerate(hf_logprobs(merged, s)):
                    self.assertAlmostEqual(want[t], b, delta=TOL,
                                           msg=f"sequence {i} token {t}: our merged export "
                                               "against PEFT's merge")

    def test_qwen2_moe_fused_experts_and_shared_expert_modules_give_peft_logprobs(self):
        with tempfile.TemporaryDirectory() as d:
            hf = random_model(qwen2_moe_config(), 9)
            base = os.path.join(d, "hf")
            hf.save_pretrained(base)
            # target_modules gate_proj / up_proj / down_proj: the shared expert's.
            pm = peft_fused(hf, 10, r=2, alpha=6, use_rslora=True,
                            target_modules=("k_proj", "gate_proj", "up_proj", "down_proj"))
            adapter_dir = os.path.join(d, "adapter")
            pm.save_pretrained(adapter_dir)
            with safetensors.safe_open(
                    os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
                self.assertIn("base_model.model.model.layers.0.mlp.shared_expert.up_proj"
                              ".lora_A.weight", set(f.keys()))
            model = rl.Model(base, {"threads": 1})
            ours, cu = our_logprobs(model, "fused", adapter_dir)
            self.assert_matches(ours, cu, pm, "with PEFT's fused adapter (Qwen2-MoE)")
            self.assert_experts_matter(ours, cu, pm)

    def test_peft_resaved_per_expert_adapter_loads_back_with_its_logprobs(self):
        # PEFT loads our per-expert adapter onto the fused experts (gate_proj and
        # up_proj become one pair of rank 2r, block-diagonal) and saves it so.
        with tempfile.TemporaryDirectory() as d, \
                rl.Runtime(plugin_path=PLUGINS, default_plugins=False) as rt:
            hf = random_model(qwen3_moe_config(), 11)
            ours, cu, adapter_dir, _ = train_and_save(rt, hf, d, 12, "all-linear")
            pm = peft.PeftModel.from_pretrained(hf, adapter_dir).eval()
            resaved = os.path.join(d, "resaved")
            pm.save_pretrained(resaved)
            with open(os.path.join(resaved, "adapter_config.json")) as f:
                cfg = json.load(f)
            self.assertEqual(sorted(cfg["target_parameters"]), ["down_proj", "gate_up_proj"])
            self.assertEqual(list(cfg["rank_pattern"].values()), [8])
            model = rl.Model(os.path.join(d, "hf"), {"threads": 1})
            back, _ = our_logprobs(model, "back", resaved)
            for t, (a, b) in enumerate(zip(ours, back)):
                self.assertAlmostEqual(a, b, delta=TOL, msg=f"token {t} after PEFT's re-save")
            self.assert_matches(back, cu, pm, "with PEFT's re-saved adapter")

    def test_what_per_expert_pairs_cannot_hold_is_refused_naming_the_key(self):
        with tempfile.TemporaryDirectory() as d:
            hf = random_model(qwen3_moe_config(), 13)
            base = os.path.join(d, "hf")
            hf.save_pretrained(base)
            model = rl.Model(base, {"threads": 1})

            def refused(name, pm_or_edit, pattern):
                path = os.path.join(d, name)
                pm_or_edit(path)
                with self.assertRaisesRegex(rl.Error, pattern):
                    model.load_adapter(name, path)

            # gate_up_proj at rank 2r whose gate and up rows share directions.
            def dense_rank_2r(path):
                pm = peft_fused(random_model(qwen3_moe_config(), 13), 14,
                                rank_pattern={"gate_up_proj": 6}, alpha_pattern={"gate_up_proj": 10})
                pm.save_pretrained(path)
            refused("dense2r", dense_rank_2r,
                    r"layers\.1\.mlp\.experts\.base_layer\.lora_B\.weight.*not block-diagonal")

            # Only layer 1's experts: an adapter here adapts every sparse layer alike.
            def one_layer(path):
                pm = peft_fused(random_model(qwen3_moe_config(), 13), 15,
                                target_parameters=["model.layers.1.mlp.experts.down_proj"])
                pm.save_pretrained(path)
            refused("onelayer", one_layer, r"model\.layers\.3\.mlp\.experts\.down_proj")

            # Another rank on the attention.
            def q_rank(path):
                pm = peft_fused(random_model(qwen3_moe_config(), 13), 16,
                                rank_pattern={"q_proj": 4})
                pm.save_pretrained(path)
            refused("qrank", q_rank, r'rank_pattern\["q_proj"\] = 4 for model\.layers\.0')

            # The router's weight.
            def router(path):
                peft_fused(random_model(qwen3_moe_config(), 13), 17).save_pretrained(path)
                cfg_path = os.path.join(path, "adapter_config.json")
                with open(cfg_path) as f:
                    cfg = json.load(f)
                cfg["target_parameters"].append("mlp.gate.weight")
                with open(cfg_path, "w") as f:
                    json.dump(cfg, f)
            refused("router", router, r"target_parameters\[2\] is \"mlp\.gate\.weight\"")


if __name__ == "__main__":
    unittest.main()
