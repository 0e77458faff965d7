// The small tiny-architecture model the trainer tests share (lora, dist, ...).
#pragma once

#include "rl/core/tiny.hpp"

#include <cstdint>

namespace rl::core::test {

/// Hidden 64, 4 attention heads of 16, 2 KV heads, `layers` layers.
inline TinyModelSpec small_tiny_spec(int64_t layers) {
    TinyModelSpec s;
    s.hidden_size = 64;
    s.intermediate_size = 128;
    s.num_hidden_layers = layers;
    s.num_attention_heads = 4;
    s.num_key_value_heads = 2;
    s.head_dim = 16;
    return s;
}

} // namespace rl::core::test
