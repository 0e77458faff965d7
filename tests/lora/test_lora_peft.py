"""Our LoRA files against Hugging Face: an adapter trained by rl (through the
Python bindings), saved in PEFT's layout, loads with transformers + peft over
the tiny model's HF folder and gives our logprobs; the merged export does too,
in transformers and in rl.model. Skips (77) without transformers / peft."""

import os
import tempfile
import unittest

from hf_util import hf_logprobs, import_or_skip, train_adapter

torch, transformers, peft = import_or_skip("torch", "transformers", "peft")
import rl

PLUGINS = os.environ["RL_TEST_PLUGIN_DIR"]
TOL = 1e-5


class PeftTest(unittest.TestCase):
    def test_adapter_and_merged_export_match_transformers_and_peft(self):
        with tempfile.TemporaryDirectory() as d, \
                rl.Runtime(plugin_path=PLUGINS, default_plugins=False) as rt:
            base = os.path.join(d, "tiny")
            rl.init_model("tiny", base, 7)
            model = rl.Model(base, {"threads": 1})
            ids = list(b"hello lora world")
            batch = {"input_ids": ids, "cu_seqlens": [0, len(ids)]}
            ours, adapter_dir, merged_dir = train_adapter(
                rt, model, batch, d, 1e-2, 3, "all-linear")
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
