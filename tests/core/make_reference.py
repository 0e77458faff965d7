#!/usr/bin/python3
"""Writes the reference checkpoints and logits in tests/core/data/.

One small checkpoint per supported architecture (Llama, Qwen2, Qwen3) in the
Hugging Face folder layout, and the logits a straightforward float64
implementation of the transformers equations gives for a few packed
sequences. Written independently of the C++ code: its own safetensors
writer, its own rotary tables, repeat_kv for grouped heads, one sequence at a
time. Needs only Debian's python3-torch (`apt-get install python3-torch`; make test does not):

    /usr/bin/python3 tests/core/make_reference.py

The C++ test (tests/core/reference_test.cpp) loads each folder with
rl::core::load_pretrained and compares.
"""
import json
import math
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")

DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
               torch.int64: "I64", torch.float64: "F64"}


def write_safetensors(path, tensors, metadata=None):
    """Minimal safetensors writer: header JSON + raw little-endian data."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- the model


def inv_freq_of(cfg):
    dim = cfg["head_dim"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    rs = cfg.get("rope_scaling")
    if rs is None:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"]
    assert kind == "llama3"
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    out = []
    for f in inv.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:            # high frequency: unchanged
            out.append(f)
        elif wavelen > old / lo:          # low frequency: interpolated
            out.append(f / factor)
        else:                             # in between: blend
            s = (old / wavelen - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return torch.tensor(out, dtype=torch.float64)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def forward_one(cfg, W, ids, pos):
    """Logits [L, vocab] of one sequence; W holds float64 weights by HF name."""
    L = len(ids)
    H, KVH, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    freqs = torch.tensor(pos, dtype=torch.float64)[:, None] * inv_freq_of(cfg)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]     # [L, 1, D]
    h = W["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.full((L, L), float("-inf"), dtype=torch.float64).triu(1)

    def lin(x, name):
        y = x @ W[name + ".weight"].T
        if name + ".bias" in W:
            y = y + W[name + ".bias"]
        return y

    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        x = rms_norm(h, W[p + "input_layernorm.weight"], eps)
        q = lin(x, p + "self_attn.q_proj").view(L, H, D)
        k = lin(x, p + "self_attn.k_proj").view(L, KVH, D)
        v = lin(x, p + "self_attn.v_proj").view(L, KVH, D)
        if p + "self_attn.q_norm.weight" in W:
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = H // KVH
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)   # [H, L, D]
        probs = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D) + mask, dim=-1)
        attn = (probs @ v).transpose(0, 1).reshape(L, H * D)
        h = h + lin(attn, p + "self_attn.o_proj")
        x = rms_norm(h, W[p + "post_attention_layernorm.weight"], eps)
        gate = lin(x, p + "mlp.gate_proj")
        h = h + lin(torch.nn.functional.silu(gate) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
    h = rms_norm(h, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    return h @ head.T


# ------------------------------------------------------------- checkpoints


def make_weights(cfg, gen, arch):
    V, Hd, I = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    H, KVH, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def randn(*shape, std=0.2):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    def norm_w(n):
        return 1.0 + randn(n, std=0.1)

    qkv_bias = arch == "qwen2" or cfg.get("attention_bias", False)
    o_bias = arch != "qwen2" and cfg.get("attention_bias", False)
    mlp_bias = cfg.get("mlp_bias", False)
    W = {"model.embed_tokens.weight": randn(V, Hd, std=0.5)}
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        for name, shape in (("q_proj", (H * D, Hd)), ("k_proj", (KVH * D, Hd)),
                            ("v_proj", (KVH * D, Hd)), ("o_proj", (Hd, H * D))):
            W[p + "self_attn." + name + ".weight"] = randn(*shape)
            if (name != "o_proj" and qkv_bias) or (name == "o_proj" and o_bias):
                W[p + "self_attn." + name + ".bias"] = randn(shape[0], std=0.1)
        if arch == "qwen3":
            W[p + "self_attn.q_norm.weight"] = norm_w(D)
            W[p + "self_attn.k_norm.weight"] = norm_w(D)
        for name, shape in (("gate_proj", (I, Hd)), ("up_proj", (I, Hd)), ("down_proj", (Hd, I))):
            W[p + "mlp." + name + ".weight"] = randn(*shape)
            if mlp_bias:
                W[p + "mlp." + name + ".bias"] = randn(shape[0], std=0.1)
        W[p + "input_layernorm.weight"] = norm_w(Hd)
        W[p + "post_attention_layernorm.weight"] = norm_w(Hd)
    W["model.norm.weight"] = norm_w(Hd)
    if not cfg["tie_word_embeddings"]:
        W["lm_head.weight"] = randn(V, Hd, std=0.5)
    return W


CASES = {
    # Llama 3 style RoPE scaling with a small original context so that all
    # three frequency bands occur at head_dim 8; attention and MLP biases;
    # float16 on disk; an old-style rotary inv_freq buffer the loader skips.
    "llama": dict(arch="llama", dtype=torch.float16, shards=1, config={
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False,
        "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}),
    # Qwen2: q/k/v bias, linear RoPE scaling, tied embeddings, bfloat16 on disk.
    "qwen2": dict(arch="qwen2", dtype=torch.bfloat16, shards=1, config={
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0}, "tie_word_embeddings": True,
        "use_sliding_window": False, "sliding_window": 64, "max_window_layers": 2,
        "hidden_act": "silu", "eos_token_id": [2, 3], "torch_dtype": "bfloat16"}),
    # Qwen3: q/k RMSNorm, head_dim larger than hidden / heads, one key/value
    # head for four query heads, float32, two shards with an index.
    "qwen3": dict(arch="qwen3", dtype=torch.float32, shards=2, config={
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 16, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None, "attention_bias": False,
        "tie_word_embeddings": False, "use_sliding_window": False,
        "hidden_act": "silu", "eos_token_id": 2, "torch_dtype": "float32"}),
}

# Packed sequences: (token ids, first position). The third continues at 37.
SEQUENCES = [(7, 0), (5, 0), (4, 37), (1, 0)]


def main():
    os.makedirs(DATA, exist_ok=True)
    for name, case in CASES.items():
        gen = torch.Generator().manual_seed(1234 + len(name))
        cfg = dict(case["config"])
        cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        W = make_weights(cfg, gen, case["arch"])
        # The reference computes with the weights as stored (rounded to the disk dtype).
        stored = {k: v.to(case["dtype"]) for k, v in W.items()}
        W64 = {k: v.to(torch.float64) for k, v in stored.items()}

        folder = os.path.join(DATA, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(case["config"], f, indent=2, sort_keys=True)
            f.write("\n")
        files = stored
        if name == "llama":
            files = dict(stored)
            files["model.layers.0.self_attn.rotary_emb.inv_freq"] = inv_freq_of(cfg).float()
        if case["shards"] == 1:
            write_safetensors(os.path.join(folder, "model.safetensors"), files, {"format": "pt"})
        else:
            names = sorted(files)
            half = len(names) // 2
            parts = [names[:half], names[half:]]
            weight_map = {}
            for i, part in enumerate(parts):
                fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(parts))
                write_safetensors(os.path.join(folder, fname), {n: files[n] for n in part},
                                  {"format": "pt"})
                weight_map.update({n: fname for n in part})
            total = sum(t.numel() * t.element_size() for t in files.values())
            with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f,
                          indent=2, sort_keys=True)
                f.write("\n")

        ids, cu, pos, logits = [], [0], [], []
        for length, start in SEQUENCES:
            seq = torch.randint(0, cfg["vocab_size"], (length,), generator=gen).tolist()
            p = list(range(start, start + length))
            logits.append(forward_one(cfg, W64, seq, p))
            ids += seq
            pos += p
            cu.append(len(ids))
        write_safetensors(os.path.join(DATA, name + "_expected.safetensors"), {
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "cu_seqlens": torch.tensor(cu, dtype=torch.int64),
            "position_ids": torch.tensor(pos, dtype=torch.int64),
            "logits": torch.cat(logits).to(torch.float32),
        })
        print("wrote", folder)


if __name__ == "__main__":
    main()
