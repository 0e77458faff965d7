// The small mixture-of-experts models of the MoE suites (moe_test.cpp,
// tests/lora/lora_moe_test.cpp): a Qwen3-MoE / Qwen2-MoE config and the
// tiny-moe preset shrunk.
#pragma once

#include "../core/small_tiny_spec.hpp"

#include "rl/core/tiny.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace rl::core::test {

// A small Qwen3-MoE (or Qwen2-MoE with a shared expert) config: 3 layers,
// layer 1 dense when `mixed` (mlp_only_layers), 6 experts, top-2.
inline nlohmann::json moe_config(const std::string &arch, bool mixed = false) {
    using Json = nlohmann::json;
    Json j{{"vocab_size", 97},
           {"hidden_size", 48},
           {"intermediate_size", 80},
           {"num_hidden_layers", 3},
           {"num_attention_heads", 4},
           {"num_key_value_heads", 2},
           {"rms_norm_eps", 1e-6},
           {"rope_theta", 10000.0},
           {"tie_word_embeddings", false},
           {"num_experts", 6},
           {"num_experts_per_tok", 2},
           {"moe_intermediate_size", 24},
           {"norm_topk_prob", arch == "qwen3_moe"},
           {"mlp_only_layers", mixed ? Json::array({1}) : Json::array()}};
    if (arch == "qwen3_moe") {
        j["architectures"] = {"Qwen3MoeForCausalLM"};
        j["head_dim"] = 16;
    } else {
        j["architectures"] = {"Qwen2MoeForCausalLM"};
        j["shared_expert_intermediate_size"] = 40;
    }
    j["model_type"] = arch;
    return j;
}

// The tiny-moe preset shrunk: hidden 64, 2 sparse layers of 8 experts of 32, top-2.
inline TinyModelSpec small_moe_spec() {
    TinyModelSpec s = small_tiny_spec(2);
    s.num_experts = 8;
    s.moe_intermediate_size = 32;
    s.max_position_embeddings = 256;
    return s;
}

} // namespace rl::core::test
