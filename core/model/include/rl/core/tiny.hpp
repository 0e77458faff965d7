// The built-in tiny model: a Qwen3-architecture model (or Qwen3-MoE, the
// "tiny-moe" preset) of a few million
// parameters over a byte-level vocabulary (256 byte tokens + <|endoftext|>,
// <|im_start|>, <|im_end|>), small enough to train from scratch on a laptop
// CPU. Written as a complete Hugging Face folder that loads through
// load_pretrained and in transformers.
#pragma once

#include <cstdint>
#include <string>

namespace rl::core {

struct TinyModelSpec {
    int64_t hidden_size = 256;
    int64_t intermediate_size = 768;
    int64_t num_hidden_layers = 4;
    int64_t num_attention_heads = 4;
    int64_t num_key_value_heads = 2;
    int64_t head_dim = 64;
    int64_t max_position_embeddings = 2048;
    double rope_theta = 10000.0;
    double init_std = 0.02;
    /// > 0: a Qwen3ForSequenceClassification with this many labels (a reward
    /// model's shape: score head, pad_token_id <|endoftext|>) instead of the
    /// causal LM.
    int64_t num_labels = 0;
    // num_experts > 0: Qwen3-MoE (Qwen3MoeForCausalLM) with every layer sparse.
    int64_t num_experts = 0;
    int64_t num_experts_per_tok = 2;
    int64_t moe_intermediate_size = 192;
    bool norm_topk_prob = true;
};

/// The "tiny-moe" preset: the tiny shape with 8 experts of width 192, top-2.
TinyModelSpec tiny_moe_spec();
/// The spec of a preset by name ("tiny", "tiny-moe"); an unknown name is an
/// error listing the valid ones.
TinyModelSpec tiny_preset_spec(const std::string &preset);

/// Token ids of the tiny vocabulary: byte b is id b.
constexpr int32_t kTinyEndOfText = 256; ///< <|endoftext|> (pad)
constexpr int32_t kTinyImStart = 257;   ///< <|im_start|>
constexpr int32_t kTinyImEnd = 258;     ///< <|im_end|> (eos)
constexpr int64_t kTinyVocabSize = 259;

/// config.json text of the tiny model.
std::string tiny_config_json(const TinyModelSpec &spec = {});
/// tokenizer.json text of the byte-level tokenizer (no merges).
std::string tiny_tokenizer_json();
/// tokenizer_config.json text (ChatML chat template, eos <|im_end|>, pad <|endoftext|>).
std::string tiny_tokenizer_config_json();

/// Writes config.json, model.safetensors (fp32, seeded normal(0, init_std)
/// init), tokenizer.json, tokenizer_config.json, special_tokens_map.json and
/// generation_config.json into `dir` (created if needed). Same seed, same bytes.
void write_tiny_model(const std::string &dir, uint64_t seed, const TinyModelSpec &spec = {});

} // namespace rl::core
