// Model configuration from a Hugging Face config.json (LlamaForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, and
// the ...ForSequenceClassification classes of the same trunks: reward models).
// Anything this core cannot run exactly as transformers would is refused with
// an error naming the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rl::core {

enum class Architecture { Llama, Qwen2, Qwen3, Qwen2Moe, Qwen3Moe };
enum class RopeScaling { None, Linear, Llama3 };
/// What sits on the trunk: the language-model head (lm_head, or the tied
/// embedding), or a sequence-classification head (`score`, [num_labels,
/// hidden], no bias) read at each sequence's last token: a reward model.
enum class Head { CausalLM, SequenceClassification };

/// "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM",
/// "Qwen3MoeForCausalLM".
const char *architecture_name(Architecture a);

struct ModelConfig {
    Architecture architecture = Architecture::Qwen3;
    std::string model_type; ///< "llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe"
    Head head = Head::CausalLM;
    /// SequenceClassification: the score head's outputs (config "num_labels",
    /// else the size of "id2label", else 2 as transformers defaults); 0 otherwise.
    int64_t num_labels = 0;

    int64_t vocab_size = 0;
    int64_t hidden_size = 0;
    int64_t intermediate_size = 0;
    int64_t num_hidden_layers = 0;
    int64_t num_attention_heads = 0;
    int64_t num_key_value_heads = 0;
    int64_t head_dim = 0;
    int64_t max_position_embeddings = 0;
    double rms_norm_eps = 1e-6;

    double rope_theta = 10000.0;
    RopeScaling rope_scaling = RopeScaling::None;
    double rope_factor = 1.0;                          ///< linear and llama3
    double rope_low_freq_factor = 1.0;                 ///< llama3
    double rope_high_freq_factor = 4.0;                ///< llama3
    int64_t rope_original_max_position_embeddings = 0; ///< llama3

    bool tie_word_embeddings = false;
    bool qkv_bias = false; ///< bias on q_proj, k_proj, v_proj
    bool o_bias = false;   ///< bias on o_proj
    bool mlp_bias = false; ///< bias on gate_proj, up_proj, down_proj
    bool qk_norm = false;  ///< per-head RMSNorm on q and k before RoPE (Qwen3)

    // Mixture of experts (Qwen2-MoE, Qwen3-MoE; docs/model.md). num_experts 0: every layer dense.
    int64_t num_experts = 0;
    int64_t num_experts_per_tok = 0;             ///< top-k
    int64_t moe_intermediate_size = 0;           ///< each expert's SwiGLU width
    bool norm_topk_prob = false;                 ///< renormalize the top-k probabilities to sum 1
    int64_t decoder_sparse_step = 1;             ///< layer i is MoE when (i + 1) % step == 0 ...
    std::vector<int64_t> mlp_only_layers;        ///< ... and i is not listed here
    int64_t shared_expert_intermediate_size = 0; ///< Qwen2-MoE's gated shared expert; 0: none
    double router_aux_loss_coef = 0.0;           ///< the load-balancing loss weight
    bool output_router_logits = false;           ///< transformers adds the aux loss only when set
    /// Router product, softmax and top-k in float32 whatever the model dtype
    /// (not a config.json key; transformers multiplies in the model dtype).
    bool router_fp32 = true;

    std::optional<int64_t> bos_token_id;
    std::vector<int64_t> eos_token_ids;
    std::optional<int64_t> pad_token_id;
    std::string torch_dtype; ///< as written ("bfloat16", "float32", ...), may be empty

    /// The config.json text this was parsed from (unknown keys preserved on save).
    std::string json;

    int64_t num_key_value_groups() const { return num_attention_heads / num_key_value_heads; }
    int64_t q_size() const { return num_attention_heads * head_dim; }
    int64_t kv_size() const { return num_key_value_heads * head_dim; }
    bool is_classifier() const { return head == Head::SequenceClassification; }
    /// The transformers class: "Qwen3ForCausalLM", "Qwen3ForSequenceClassification", ...
    std::string class_name() const;
    /// Whether decoder layer `layer` is a sparse MoE block (else a dense MLP).
    bool is_moe_layer(int64_t layer) const;
    /// Whether any layer is.
    bool has_moe() const;

    /// Parses config.json text; `source` names the file in errors.
    static ModelConfig parse(const std::string &json_text,
                             const std::string &source = "config.json");
    /// Reads and parses a config.json file.
    static ModelConfig load(const std::string &path);

    /// The config.json text to save: the original keys, with the dtype key
    /// ("torch_dtype", or "dtype" where the original used it) set to `dtype`
    /// when non-empty. For a config built in code (json empty), all fields.
    std::string to_json(const std::string &dtype = "") const;
};

} // namespace rl::core
