"""LoRA on the experts against Hugging Face: on a random tiny Qwen3-MoE built
and saved by transformers, an adapter trained by rl on every expert's
gate_proj / up_proj / down_proj (and the attention), saved in PEFT's layout
(per-expert keys mlp.experts.<E>.<proj>), loads with transformers + peft and
gives our logprobs; so does the merged export. Skips (77) without
transformers / peft."""

import os
import tempfile
import unittest

from hf_util import hf_logprobs, import_or_skip, random_model, train_adapter

torch, transformers, peft, safetensors = import_or_skip(
    "torch", "transformers", "peft", "safetensors")
import rl

PLUGINS = os.environ["RL_TEST_PLUGIN_DIR"]
TOL = 1e-5
SEQS = [[5, 17, 3, 44, 9, 28, 60, 2, 11, 39, 7], [33, 1, 58, 20, 4], [12, 12, 40, 6, 19, 23, 51]]


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
    batch, cu = batch_of(SEQS)
    ours, adapter_dir, merged_dir = train_adapter(
        rt, rl.Model(base, {"threads": 1}), batch, d, 2e-2, seed, targets)
    return ours, cu, adapter_dir, merged_dir


def load_merged(merged_dir):
    """A merged export, loaded by transformers."""
    return transformers.AutoModelForCausalLM.from_pretrained(
        merged_dir, torch_dtype=torch.float32).eval()


class LogprobsCase(unittest.TestCase):
    def assert_matches(self, ours, cu, model, what):
        """`model`'s logprobs on SEQS equal ours (on the packed SEQS, cu_seqlens `cu`)
        within TOL; `what` names the model in a failure."""
        for i, s in enumerate(SEQS):
            for t, b in enumerate(hf_logprobs(model, s)):
                self.assertAlmostEqual(ours[cu[i] + t], b, delta=TOL,
                                       msg=f"sequence {i} token {t} {what}")


class MoePeftTest(LogprobsCase):
    def test_qwen2_moe_expert_and_shared_expert_adapter_merged_export_matches_transformers(self):
        # peft 0.21 over transformers 5 cannot put a per-expert adapter on
        # Qwen2-MoE's fused experts (docs/lora.md); the merged export loads.
        with tempfile.TemporaryDirectory() as d, \
                rl.Runtime(plugin_path=PLUGINS, default_plugins=False) as rt:
            hf = random_model(qwen2_moe_config(), 4)
            ours, cu, adapter_dir, merged_dir = train_and_save(
                rt, hf, d, 5, ["gate_proj", "up_proj", "down_proj"])
            with safetensors.safe_open(
                    os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
                keys = set(f.keys())
            self.assertIn("base_model.model.model.layers.1.mlp.shared_expert.down_proj"
                          ".lora_B.weight", keys)
            self.assertIn("base_model.model.model.layers.0.mlp.experts.4.up_proj.lora_A.weight",
                          keys)
            plain = hf_logprobs(hf, SEQS[0])
            self.assertGreater(max(abs(ours[t] - b) for t, b in enumerate(plain)), 1e-3)
            self.assert_matches(ours, cu, load_merged(merged_dir), "of the merged export")

    def test_expert_adapter_and_merged_export_match_transformers_and_peft(self):
        with tempfile.TemporaryDirectory() as d, \
                rl.Runtime(plugin_path=PLUGINS, default_plugins=False) as rt:
            hf = random_model(qwen3_moe_config(), 3)
            ours, cu, adapter_dir, merged_dir = train_and_save(rt, hf, d, 3, "all-linear")

            # PEFT's per-expert key names, the experts trained.
            with safetensors.safe_open(
                    os.path.join(adapter_dir, "adapter_model.safetensors"), "pt") as f:
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
            self.assert_matches(ours, cu, with_peft, "with the PEFT adapter")
            # The expert adapters matter: without them PEFT's logprobs move.
            with torch.no_grad():
                for p in expert_lora:
                    p.zero_()
            moved = max(abs(ours[cu[0] + t] - b)
                        for t, b in enumerate(hf_logprobs(with_peft, SEQS[0])))
            self.assertGreater(moved, 1e-4, "the expert adapters changed nothing")

            self.assert_matches(ours, cu, load_merged(merged_dir), "of the merged export")


if __name__ == "__main__":
    unittest.main()
