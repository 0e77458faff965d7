// The shape of a recorded routing (R3), shared by generate, episodes and the
// serving scheduler: one row per token of sparse_layers(config) layers of
// num_experts_per_tok experts.
#pragma once

#include "rl/core/config.hpp"

#include <cstdint>

namespace rl::core::detail {

/// The model's sparse MoE layers, the L of a routing [T, L, K].
inline int64_t sparse_layers(const ModelConfig &config) {
    int64_t layers = 0;
    for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers += config.is_moe_layer(i) ? 1 : 0;
    return layers;
}

} // namespace rl::core::detail
