"""Reward models against transformers: random tiny Llama / Qwen2 / Qwen3
...ForSequenceClassification models made and saved by transformers load in
rl (through the Python bindings), and a forward-only trainer's "scores"
equal transformers' pooled logits, including sequences that end in pad
tokens (transformers pools the last token that is not the pad token).
Skips (77) without transformers."""

import os
import sys
import tempfile
import unittest

try:
    import torch
    import transformers
except ImportError as e:  # the venv could not get them (no PyPI)
    print(f"skipping: {e}")
    sys.exit(77)

import rl

TOL = 1e-4
PAD = 0

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             pad_token_id=PAD)


def make(kind, num_labels, seed):
    torch.manual_seed(seed)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**SMALL, num_labels=num_labels)
        model = transformers.LlamaForSequenceClassification(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**SMALL, num_labels=num_labels)
        model = transformers.Qwen2ForSequenceClassification(cfg)
    else:
        cfg = transformers.Qwen3Config(**SMALL, head_dim=16, num_labels=num_labels)
        model = transformers.Qwen3ForSequenceClassification(cfg)
    with torch.no_grad():  # transformers' init leaves the head tiny: make scores differ clearly
        for p in model.parameters():
            p.normal_(0.0, 0.2 if p.dim() > 1 else 0.05)
        model.score.weight.normal_(0.0, 1.0)
    return model.eval()


SEQUENCES = [
    [5, 17, 33, 2, 8, 90],
    [44, 3, 3, 71, PAD, PAD],  # ends in pad tokens: pooled at 71
    [9, 12],
    [PAD, 60, 1, 14, 22, 35, 48, 61, 74, 87],  # a pad token inside counts as a token
]


class RewardModelTest(unittest.TestCase):
    def check(self, kind, num_labels, seed):
        with tempfile.TemporaryDirectory() as d:
            hf = make(kind, num_labels, seed)
            hf.save_pretrained(d)
            theirs = []
            with torch.no_grad():
                for ids in SEQUENCES:  # one at a time: no padding of ours added
                    theirs.append(hf(torch.tensor([ids])).logits[0].tolist())
            model = rl.Model(d, {"threads": 1})
            info = model.info()
            self.assertEqual(info["task"], "sequence_classification")
            self.assertEqual(info["num_labels"], num_labels)
            self.assertEqual(info["architecture"], type(hf).__name__)
            trainer = model.trainer({"forward_only": True})
            ids = [t for s in SEQUENCES for t in s]
            cu = [0]
            for s in SEQUENCES:
                cu.append(cu[-1] + len(s))
            out = trainer.forward({"input_ids": ids, "cu_seqlens": cu})
            self.assertEqual(out.scalars["num_labels"], num_labels)
            ours = out.tensors["scores"]
            self.assertEqual(len(ours), len(SEQUENCES) * num_labels)
            spread = max(abs(v) for row in theirs for v in row)
            self.assertGreater(spread, 0.1, "scores too small to compare")
            for i, row in enumerate(theirs):
                for k, v in enumerate(row):
                    self.assertAlmostEqual(ours[i * num_labels + k], v, delta=TOL,
                                           msg=f"{kind}: sequence {i}, label {k}")

    def test_llama_scores_equal_transformers(self):
        self.check("llama", 1, 1)

    def test_qwen2_scores_equal_transformers(self):
        self.check("qwen2", 3, 2)

    def test_qwen3_scores_equal_transformers(self):
        self.check("qwen3", 2, 3)


if __name__ == "__main__":
    unittest.main()
