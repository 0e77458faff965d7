"""What the cross-checks against Hugging Face share (tests/lora: test_lora_peft,
test_lora_moe_peft, test_lora_moe_peft_fused; tests/moe: test_moe_transformers,
which finds this folder on its PYTHONPATH): the import that skips a test (77)
when its venv could not get a package from PyPI, transformers' logprobs aligned
as rl's trainer aligns them, random MoE models whose routers choose clearly,
and an adapter trained by rl and saved with its merged export."""

import importlib
import os
import sys


def import_or_skip(*names):
    """The modules `names`, in order; exits 77 (ctest's skip) when one cannot
    be imported (the venv could not get it: no PyPI)."""
    try:
        return [importlib.import_module(n) for n in names]
    except ImportError as e:
        print(f"skipping: {e}")
        sys.exit(77)


torch, transformers = import_or_skip("torch", "transformers")


def hf_logprobs(model, ids):
    """log p(ids[t] | ids[:t]) for t >= 1 (position 0: 0), as rl's trainer aligns them."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [0.0] + [lp[t - 1, ids[t]].item() for t in range(1, len(ids))]


def random_model(config, seed):
    """A transformers model of `config` with weights large enough for the
    router to prefer some experts clearly (the default init routes nearly
    uniformly)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.5 if name.endswith("mlp.gate.weight") else 0.08)
    return model.eval()


def train_adapter(rt, model, batch, d, learning_rate, seed, targets):
    """Trains a LoRA adapter "sft" of the rl.Model `model` (rank 4, alpha 8,
    drawn from `seed`, on `targets`) for 3 steps of causallm_loss on `batch`;
    saves it in PEFT's layout (d/adapter) and its merged export (d/merged).
    Returns (our logprobs on `batch` after training, adapter folder, merged
    folder)."""
    trainer = model.trainer({"learning_rate": learning_rate, "adapter": "sft",
                             "lora": {"rank": 4, "alpha": 8, "seed": seed,
                                      "target_modules": targets}})
    ce = rt.create("loss", "causallm_loss")
    for _ in range(3):
        trainer.forward_backward(batch, ce)
        trainer.optim_step()
    ours = trainer.forward(batch).tensors["logprobs"]
    adapter_dir = os.path.join(d, "adapter")
    merged_dir = os.path.join(d, "merged")
    model.save_adapter("sft", adapter_dir)
    model.export_merged("sft", merged_dir)
    return ours, adapter_dir, merged_dir
