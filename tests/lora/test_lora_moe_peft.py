"""LoRA on the experts against Hugging Face: on a random tiny Qwen3-MoE built
and saved by transformers, an adapter trained by rl on every expert's
gate_proj / up_proj / down_proj (and the attention), saved in PEFT's layout
(per-expert keys mlp.experts.<E>.<proj>), loads with transformers + peft and
gives our logprobs; so does the merged export. Skips (77) without
transformers / peft."""

import os
import sys
import tempfile
import unittest

try:
    import torch
    import transformers
    import peft
    from safetensors import safe_open
except ImportError as e:  # the venv could not get them (no PyPI)
    print(f"skipping: {e}")
    sys.exit(77)

import rl

PLUGINS = os.environ["RL_TEST_PLUGIN_DIR"]
TOL = 1e-5
SEQS = [[5, 17, 3, 44, 9, 28, 60, 2, 11, 39, 7], [33, 1, 58, 20, 4], [12, 12, 40, 6, 19, 23, 51]]


def hf_logprobs(model, ids):
    """log p(ids[t] | ids[:t]) for t >= 1 (position 0: 0), as rl's trainer aligns them."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [0.0] + [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def random_model(config, seed):
    """A transformers model of `config` whose router prefers some experts clearly."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.5 if name.endswith("mlp.gate.weight") else 0.08)
    return model.eval()


def qwen3_moe_config():
    # Layers 1 and 3 sparse (decoder_sparse_step 2), top-2 of 6, renormalized.
    return transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=48, intermediate_size=40, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=24,
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
        rope_theta=10000.0, tie_word_embeddings=False)


def qwen2_moe_config():
    # Every layer sparse with the gated shared expert; top-3 of 5, not renormalized.
    return transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=20,
        shared_expert_intermediate_size=36, num_experts=5, num_experts_per_tok=3,
        norm_topk_prob=False, tie_word_embeddings=False)


def batch_of(seqs):
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    return {"input_ids": [t for s in seqs for t in s], "cu_seqlens": cu}, cu


def train_and_save(rt, hf, d, seed, targets):
    """Trains an adapter ("sft") on `hf` saved in d/hf for 3 steps on SEQS; saves it
    (d/adapter) and its merged export (d/merged). Returns (our logprobs, cu_seqlens,
    adapter folder, merged folder)."""
    base = os.path.join(d, "hf")
    hf.save_pretrained(base)
    model = rl.Model(base, {"threads": 1})
    trainer = model.trainer({"learning_rate": 2e-2, "adapter": "sft",
                             "lora": {"rank": 4, "alpha": 8, "seed": seed,
                                      "target_modules": targets}})
    ce = rt.create("loss", "causallm_loss")
    batch, cu = batch_of(SEQS)
    for _ in range(3):
        trainer.forward_backward(batch, ce)
        trainer.optim_step()
    ours = trainer.forward(batch).tensors["logprobs"]
    adapter_dir = os.path.join(d, "adapter")
    merged_dir = os.path.join(d, "merged")
    model.save_adapter("sft", adapter_dir)
    model.export_merged("sft", merged_dir)
    return ours, cu, adapter_dir, merged_dir


class MoePeftTest(unittest.TestCase):
    def test_qwen2_moe_expert_and_shared_expert_adapter_merged_export_matches_transformers(self):
        # peft 0.21 over transformers 5 cannot put a per-expert adapter on
        # Qwen2-MoE's fused experts (docs/lora.md); the merged export loads.
        with tempfile.TemporaryDirectory() as d, \
                rl.Runtime(plugin_path=PLUGINS, default_plugins=False) as rt:
            hf = random_model(qwen2_moe_config(), 4)
            ours, cu, adapter_dir, merged_dir = train_and_save(
                rt, hf, d, 5, ["gate_proj", "up_proj", "down_proj"])
            with safe_open(os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
                keys = set(f.keys())
            self.assertIn("base_model.model.model.layers.1.mlp.shared_expert.down_proj"
                          ".lora_B.weight", keys)
            self.assertIn("base_model.model.model.layers.0.mlp.experts.4.up_proj.lora_A.weight",
                          keys)
            plain = hf_logprobs(hf, SEQS[0])
            self.assertGreater(max(abs(ours[t] - b) for t, b in enumerate(plain)), 1e-3)
            merged = transformers.AutoModelForCausalLM.from_pretrained(
                merged_dir, torch_dtype=torch.float32).eval()
            for i, s in enumerate(SEQS):
                for t, b in enumerate(hf_logprobs(merged, s)):
                    self.assertAlmostEqual(ours[cu[i] + t], b, delta=TOL,
                                           msg=f"sequence {i} token {t} of the merged export")

    def test_expert_adapter_and_merged_export_match_transformers_and_peft(self):
        with tempfile.TemporaryDirectory() as d, \
                rl.Runtime(plugin_path=PLUGINS, default_plugins=False) as rt:
            hf = random_model(qwen3_moe_config(), 3)
            ours, cu, adapter_dir, merged_dir = train_and_save(rt, hf, d, 3, "all-linear")

            # PEFT's per-expert key names, the experts trained.
            with safe_open(os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
                keys = set(f.keys())
                b = f.get_tensor("base_model.model.model.layers.1.mlp.experts.5.down_proj"
                                 ".lora_B.weight")
            self.assertIn("base_model.model.model.layers.3.mlp.experts.0.gate_proj.lora_A.weight",
                          keys)
            # Layer 0 is dense: its MLP is not adapted (nor is it by PEFT over transformers 5).
            self.assertNotIn("base_model.model.model.layers.0.mlp.up_proj.lora_B.weight", keys)
            self.assertIn("base_model.model.model.layers.0.self_attn.o_proj.lora_B.weight", keys)
            self.assertEqual(tuple(b.shape), (48, 4))

            with_peft = peft.PeftModel.from_pretrained(hf, adapter_dir).eval()
            expert_lora = [p for n, p in with_peft.named_parameters()
                           if ".experts." in n and "lora_B" in n]
            self.assertTrue(expert_lora, "PEFT put no adapter on the experts")
            self.assertTrue(any(p.abs().max().item() > 0 for p in expert_lora))
            for i, s in enumerate(SEQS):
                for t, b in enumerate(hf_logprobs(with_peft, s)):
                    self.assertAlmostEqual(ours[cu[i] + t], b, delta=TOL,
                                           msg=f"sequence {i} token {t} with the PEFT adapter")
            # The expert adapters matter: without them PEFT's logprobs move.
            with torch.no_grad():
                for p in expert_lora:
                    p.zero_()
            moved = max(abs(ours[cu[0] + t] - b)
                        for t, b in enumerate(hf_logprobs(with_peft, SEQS[0])))
            self.assertGreater(moved, 1e-4, "the expert adapters changed nothing")

            merged = transformers.AutoModelForCausalLM.from_pretrained(
                merged_dir, torch_dtype=torch.float32).eval()
            for i, s in enumerate(SEQS):
                for t, b in enumerate(hf_logprobs(merged, s)):
                    self.assertAlmostEqual(ours[cu[i] + t], b, delta=TOL,
                                           msg=f"sequence {i} token {t} of the merged export")


if __name__ == "__main__":
    unittest.main()
