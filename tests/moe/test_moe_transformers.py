"""Qwen3-MoE and Qwen2-MoE against transformers: random tiny configs built and
saved by transformers load in rl (through the Python bindings) and give
transformers' logprobs on packed batches; the load-balancing loss and router
z-loss the trainer reports equal transformers' aux_loss and router_z_loss_func;
rl's save_pretrained writes the
tensors transformers reads back. Skips (77) without transformers."""

import json
import os
import tempfile
import unittest

from hf_util import hf_logprobs, import_or_skip, random_model  # tests/lora

torch, transformers = import_or_skip("torch", "transformers")
import rl

TOL = 1e-4


def hf_aux_loss(model, seqs):
    """transformers' load_balancing_loss over the tokens of every sequence
    (right-padded batch, padding masked out)."""
    n = max(len(s) for s in seqs)
    ids = torch.tensor([s + [0] * (n - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in seqs])
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_router_logits=True)
    return out.aux_loss.item()


def hf_z_loss(model, seqs):
    """transformers' router_z_loss_func (Switch Transformers) over the router
    logits of every sparse layer for the tokens of every sequence."""
    from transformers.models.switch_transformers.modeling_switch_transformers import (
        router_z_loss_func)
    per_layer = None
    with torch.no_grad():
        for s in seqs:
            logits = model(torch.tensor([s]), output_router_logits=True).router_logits
            per_layer = [[x] for x in logits] if per_layer is None else \
                [acc + [x] for acc, x in zip(per_layer, logits)]
    # Every layer holds the same tokens: the mean of the layers' means is the pooled mean.
    zs = [router_z_loss_func(torch.cat(xs).float().unsqueeze(0)).item() for xs in per_layer]
    return sum(zs) / len(zs)


SEQS = [[5, 17, 3, 44, 9, 28, 60, 2, 11, 39, 7], [33, 1, 58], [12, 12, 40, 6, 19, 23, 51]]


def qwen3_moe_config():
    # Layers 1 and 3 sparse (decoder_sparse_step 2), top-2 of 6, renormalized.
    return transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=48, intermediate_size=40, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, moe_intermediate_size=24,
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=2,
        router_aux_loss_coef=0.01, rope_theta=10000.0, tie_word_embeddings=False)


def qwen2_moe_config():
    # Layer 1 dense (mlp_only_layers), the others sparse with the shared expert;
    # top-3 of 5 without renormalization.
    return transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=48, intermediate_size=40, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, moe_intermediate_size=20,
        shared_expert_intermediate_size=36, num_experts=5, num_experts_per_tok=3,
        norm_topk_prob=False, mlp_only_layers=[1], router_aux_loss_coef=0.02,
        tie_word_embeddings=False)


class MoeTransformersTest(unittest.TestCase):
    def check_architecture(self, config, arch, seed):
        with tempfile.TemporaryDirectory() as d:
            hf = random_model(config, seed)
            src = os.path.join(d, "hf")
            hf.save_pretrained(src)
            with open(os.path.join(src, "config.json")) as f:
                self.assertEqual(json.load(f)["architectures"], [arch])

            model = rl.Model(src, {"threads": 1})
            self.assertEqual(model.info()["architecture"], arch)
            trainer = model.trainer({})
            cu = [0]
            for s in SEQS:
                cu.append(cu[-1] + len(s))
            batch = {"input_ids": [t for s in SEQS for t in s], "cu_seqlens": cu}
            result = trainer.forward(batch)
            ours = result.tensors["logprobs"]
            for i, s in enumerate(SEQS):
                theirs = hf_logprobs(hf, s)
                for t, b in enumerate(theirs):
                    self.assertAlmostEqual(ours[cu[i] + t], b, delta=TOL,
                                           msg=f"{arch} sequence {i} token {t}")

            # The auxiliary loss over the same tokens.
            aux = result.metrics["moe/aux_loss"]
            self.assertAlmostEqual(aux, hf_aux_loss(hf, SEQS), delta=1e-5, msg=f"{arch} aux loss")
            z = result.metrics["moe/z_loss"]
            self.assertAlmostEqual(z, hf_z_loss(hf, SEQS), delta=1e-4 * max(1.0, z),
                                   msg=f"{arch} z-loss")

            # rl's save writes per-expert tensors transformers reads back.
            out = os.path.join(d, "saved")
            model.save(out)
            again = transformers.AutoModelForCausalLM.from_pretrained(
                out, torch_dtype=torch.float32).eval()
            for i, s in enumerate(SEQS):
                for t, (a, b) in enumerate(zip(hf_logprobs(again, s), hf_logprobs(hf, s))):
                    self.assertAlmostEqual(a, b, delta=1e-6,
                                           msg=f"{arch} after rl's save, sequence {i} token {t}")
            return model

    def test_qwen3_moe_logprobs_aux_loss_and_save_match_transformers(self):
        self.check_architecture(qwen3_moe_config(), "Qwen3MoeForCausalLM", 1)

    def test_qwen2_moe_with_shared_expert_matches_transformers(self):
        self.check_architecture(qwen2_moe_config(), "Qwen2MoeForCausalLM", 2)


if __name__ == "__main__":
    unittest.main()
