"""Our LoRA files against Hugging Face: an adapter trained by rl (through the
Python bindings), saved in PEFT's layout, loads with transformers + peft over
the tiny model's HF folder and gives our logprobs; the merged export does too,
in transformers and in rl.model. Skips (77) without transformers / peft."""

import os
import sys
import tempfile
import unittest

try:
    import torch
    import transformers
    import peft
except ImportError as e:  # the venv could not get them (no PyPI)
    print(f"skipping: {e}")
    sys.exit(77)

import rl

PLUGINS = os.environ["RL_TEST_PLUGIN_DIR"]
TOL = 1e-5


def hf_logprobs(model, ids):
    """log p(ids[t] | ids[:t]) for t >= 1 (position 0: 0), as rl's trainer aligns them."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    out = [0.0]
    for t in range(1, len(ids)):
        out.append(lp[t - 1, ids[t]].item())
    return out


class PeftTest(unittest.TestCase):
    def test_adapter_and_merged_export_match_transformers_and_peft(self):
        with tempfile.TemporaryDirectory() as d, \
                rl.Runtime(plugin_path=PLUGINS, default_plugins=False) as rt:
            base = os.path.join(d, "tiny")
            rl.init_model("tiny", base, 7)
            model = rl.Model(base, {"threads": 1})
            trainer = model.trainer({"learning_rate": 1e-2, "adapter": "sft",
                                     "lora": {"rank": 4, "alpha": 8, "seed": 3,
                                              "target_modules": "all-linear"}})
            ce = rt.create("loss", "causallm_loss")
            ids = list(b"hello lora world")
            batch = {"input_ids": ids, "cu_seqlens": [0, len(ids)]}
            for _ in range(3):
                trainer.forward_backward(batch, ce)
                trainer.optim_step()
            ours = trainer.forward(batch).tensors["logprobs"]
            adapter_dir = os.path.join(d, "adapter")
            merged_dir = os.path.join(d, "merged")
            model.save_adapter("sft", adapter_dir)
            model.export_merged("sft", merged_dir)
            info = model.adapter_info("sft")
            self.assertEqual(info["rank"], 4)
            self.assertEqual(info["version"], 3)

            hf = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
            plain = hf_logprobs(hf, ids)
            self.assertGreater(max(abs(a - b) for a, b in zip(ours, plain)), 1e-3,
                               "the adapter changed nothing")
            with_peft = peft.PeftModel.from_pretrained(hf, adapter_dir)
            theirs = hf_logprobs(with_peft, ids)
            for t, (a, b) in enumerate(zip(ours, theirs)):
                self.assertAlmostEqual(a, b, delta=TOL, msg=f"token {t} with the PEFT adapter")

            merged = transformers.AutoModelForCausalLM.from_pretrained(
                merged_dir, torch_dtype=torch.float32)
            for t, (a, b) in enumerate(zip(ours, hf_logprobs(merged, ids))):
                self.assertAlmostEqual(a, b, delta=TOL, msg=f"token {t} of the merged export")

            ours_merged = rl.Model(merged_dir, {"threads": 1}).trainer({}).forward(batch)
            for t, (a, b) in enumerate(zip(ours, ours_merged.tensors["logprobs"])):
                self.assertAlmostEqual(a, b, delta=TOL, msg=f"token {t} of rl.model(merged)")


if __name__ == "__main__":
    unittest.main()
