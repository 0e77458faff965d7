#!/usr/bin/env python3
"""Writes the generated part of the seed corpora of fuzz/corpus/ (small inputs
of the shapes the tests use); the rest are copies of tests/ data.

    python3 fuzz/make_seeds.py
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


# ---- tokenizer.json: byte-level BPE like the built-in tiny model's ----------------------
def byte_chars():
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


BC = byte_chars()


def bl(raw):
    return "".join(BC[b] for b in raw.encode())


def tokenizer(merges=(), pre=None, normalizer=None, post=None, decoder=None, added=True):
    vocab = {BC[b]: b for b in range(256)}
    merge_list = []
    for a, b in merges:
        a, b = bl(a), bl(b)
        merge_list.append(a + " " + b)
        vocab.setdefault(a + b, len(vocab))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    added_tokens = [{"id": len(vocab) + i, "content": s, "single_word": False, "lstrip": False,
                     "rstrip": False, "normalized": False, "special": True}
                    for i, s in enumerate(specials)] if added else []
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": False}
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": normalizer, "pre_tokenizer": pre or byte_level,
        "post_processor": post or byte_level, "decoder": decoder or byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merge_list}}, ensure_ascii=False)


QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
put("tokenizer_json", "tiny.json", tokenizer(added=True))
put("tokenizer_json", "merges_split_regex.json", tokenizer(
    merges=[("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), (" ", "w")],
    pre={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]},
    normalizer={"type": "NFC"}))
put("tokenizer_json", "digits_llama_post.json", tokenizer(
    merges=[("1", "2"), ("12", "3")],
    pre={"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
         "use_regex": True}]},
    normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}]},
    post={"type": "TemplateProcessing",
          "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}}],
          "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>",
                                                           "ids": [256], "tokens": []}}}))

# ---- safetensors: small images with each dtype, metadata, an empty tensor -------------
def safetensors(tensors, metadata=None, pad=0):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + data


put("safetensors", "dtypes.safetensors", safetensors([
    ("a.weight", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)),
    ("b", "BF16", [3], b"\x80\x3f" * 3),
    ("c", "I64", [1, 1], struct.pack("<q", -5)),
    ("d", "U8", [0], b""),
    ("e", "BOOL", [], b"\x01")], metadata={"format": "pt"}))
put("safetensors", "padded_header.safetensors", safetensors([
    ("x", "F16", [2], b"\x00\x3c\x00\x40")], pad=6))
put("safetensors", "empty.safetensors", safetensors([]))

# ---- config.json variants --------------------------------------------------------------
base = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 512, "tie_word_embeddings": True,
        "torch_dtype": "float32"}
put("model_config", "qwen3_small.json", json.dumps(base))
llama = dict(base, architectures=["LlamaForCausalLM"], model_type="llama",
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 256})
del llama["head_dim"]
put("model_config", "llama_rope_scaling.json", json.dumps(llama))

# ---- run configuration YAML with --set overrides ---------------------------------------
put("yaml_config", "overrides.yaml",
    "#set trainer.learning_rate=0.001\n#set run.seed=7\n#set filters=[]\n"
    "run:\n  seed: 3\ntrainer:\n  learning_rate: 1.0e-5\n"
    "filters:\n  - {name: zero_advantage, params: {eps: 0.0}}\n")

# ---- Jinja chat templates ---------------------------------------------------------------
put("jinja", "chatml.jinja",
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
put("jinja", "llama3.jinja",
    "{{- bos_token }}\n{%- if not date_string is defined %}{%- set date_string = "
    "strftime_now('%d %b %Y') %}{%- endif %}\n{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' }}{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}\n")
# the template that tours the engine, as tests/core/chat_template_test.cpp
# mutates it
with open(os.path.join(HERE, "..", "tests", "core", "data", "jinja_tour.jinja"), "rb") as f:
    put("jinja", "tools_macros.jinja", f.read())

# ---- Tinker forward_backward, JSON ----------------------------------------------------
datum = {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3, 4]}]},
         "loss_fn_inputs": {
             "target_tokens": {"data": [2, 3, 4, 5], "dtype": "int64", "shape": [4]},
             "weights": {"data": [0, 1, 1, 1], "dtype": "float32", "shape": [4]}}}
put("tinker_json", "forward_backward.json", json.dumps(
    {"forward_backward_input": {"data": [datum], "loss_fn": "cross_entropy"},
     "model_id": "m", "seq_id": 1}))
put("tinker_json", "forward_importance_sampling.json", json.dumps(
    {"forward_input": {"data": [dict(datum, loss_fn_inputs=dict(
        datum["loss_fn_inputs"], logprobs={"data": [-1.5, -0.5, -2.0, -0.1],
                                           "dtype": "float32", "shape": [4]},
        advantages={"data": [1.0, 1.0, 1.0, 1.0], "dtype": "float32", "shape": [4]}))],
        "loss_fn": "importance_sampling", "loss_fn_config": {"clip": 0.2}},
     "model_id": "m"}))
put("tinker_json", "sparse_and_xorl.json", json.dumps(
    {"forward_backward_input": {"data": [
        {"model_input": {"input_ids": [5, 6, 7]},
         "loss_fn_inputs": {"target_tokens": [6, 7, 8],
                            "weights": {"data": [1.0, 0.5], "dtype": "float32",
                                        "shape": [1, 3], "sparse_crow_indices": [0, 2],
                                        "sparse_col_indices": [0, 2]}}}],
        "loss_fn": "cross_entropy", "loss_fn_params": {"eps": 0.1}}, "model_id": "m"}))


# ---- Tinker forward_backward, protobuf --------------------------------------------------
def varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([(v & 0x7F) | 0x80])
        v >>= 7
    return out + bytes([v])


def field(n, wire, payload):
    tag = varint((n << 3) | wire)
    if wire == 2:
        return tag + varint(len(payload)) + payload
    return tag + payload


def tensor(dtype, raw, shape=None, sparse=None):
    out = b""
    if sparse is None:
        out += field(1, 2, raw)
    else:
        crow, col = sparse
        out += field(2, 2, field(1, 2, raw) + field(2, 2, struct.pack(f"<{len(crow)}q", *crow))
                     + field(3, 2, struct.pack(f"<{len(col)}q", *col)))
    out += field(3, 0, varint(dtype))
    if shape:
        out += field(4, 2, b"".join(varint(s) for s in shape))
    return out


def entry(key, value):
    return field(1, 2, key.encode()) + field(2, 2, value)


tokens = field(1, 2, field(1, 2, field(1, 2, struct.pack("<4i", 1, 2, 3, 4))))
proto_datum = (tokens
               + field(2, 2, entry("target_tokens", tensor(2, struct.pack("<4q", 2, 3, 4, 5))))
               + field(2, 2, entry("weights", tensor(1, struct.pack("<4f", 0, 1, 1, 1), [4]))))
put("tinker_proto", "forward_backward.pb",
    field(1, 2, b"m") + field(2, 0, varint(3)) + field(3, 2, proto_datum)
    + field(4, 2, b"cross_entropy"))
sparse_datum = (tokens + field(2, 2, entry("weights", tensor(
    4, b"\x80\x3f\x00\x3f", [1, 4], sparse=([0, 2], [1, 3])))))
put("tinker_proto", "sparse_bf16_config.pb",
    field(1, 2, b"m") + field(3, 2, sparse_datum) + field(4, 2, b"ppo")
    + field(5, 2, field(1, 2, b"clip_low_threshold") + field(2, 1, struct.pack("<d", 0.8)))
    + field(7, 2, field(1, 2, b"mode") + field(2, 2, field(2, 2, b"token")))
    + field(6, 0, varint(1)))

# ---- OpenAI / SGLang request bodies -----------------------------------------------------
put("serve_fields", "completions.json", json.dumps(
    {"model": "tiny", "prompt": "abc", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9,
     "top_k": 20, "n": 2, "stop": ["\n", "x"], "stop_token_ids": [1, 2], "seed": 42,
     "stream": True, "stream_options": {"include_usage": True}, "logprobs": 2,
     "frequency_penalty": 0, "logit_bias": {}, "best_of": 1}))
put("serve_fields", "chat.json", json.dumps(
    {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
     "logprobs": True, "top_logprobs": 3, "return_token_ids": True, "ignore_eos": False,
     "echo": False, "repetition_penalty": 1}))
put("serve_fields", "sglang_generate.json", json.dumps(
    {"input_ids": [[1, 2, 3], [4, 5]], "sampling_params": {"max_new_tokens": 4,
     "temperature": 0, "stop_token_ids": [7], "skip_special_tokens": True},
     "return_logprob": True, "rid": "r1", "stream": False}))
put("serve_fields", "server_options.json", json.dumps(
    {"host": "127.0.0.1", "port": 8000, "api_key": "k", "max_body_bytes": 1048576,
     "max_connections": 64, "idle_timeout_s": 30.5}))

# ---- MoE routings (R3) on the training server's wire ------------------------------------
import base64
ids = struct.pack("<20i", *([0, 1, 2, 3] * 5))
put("routed_experts", "nested_lists.json", json.dumps(
    {"forward_backward_input": {"routed_experts": [
        [[[0, 1], [2, 3]]] * 5, [[[1, 2], [3, 0]]] * 4]}}))
put("routed_experts", "base64_objects.json", json.dumps(
    {"forward_backward_input": {"routed_experts": [
        {"data": base64.b64encode(ids).decode(), "shape": [5, 2, 2], "dtype": "int32"},
        None]}}))
put("routed_experts", "sglang_short_bare.json", json.dumps(
    {"routed_experts": [base64.b64encode(ids[:64]).decode(),
                        base64.b64encode(ids[:48]).decode()]}))
put("routed_experts", "logits_refused.json", json.dumps(
    {"forward_backward_input": {"routed_experts": [None, None],
                                "routed_expert_logits": [[0.5]]}}))
