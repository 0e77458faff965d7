// rl/core/value_head.hpp: the PPO critic as a scalar head on the policy's
// trunk. V(h) = h . w + b over the final-norm hidden state h of a position,
// in float32 (weight [1, hidden], bias [1]) whatever the model's dtype. The
// trainer computes it with the logprobs from the same forward (one pass for
// both), hands it to losses as the differentiable input "values" and trains
// it with the policy's optimizer. Saved next to the model's weights as
// value_head.safetensors (tensors "value_head.weight", "value_head.bias"), a
// file Hugging Face loaders ignore. See docs/model.md, "Value head".
#pragma once

#include "rl/core/model.hpp"

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {

/// File name of the head inside a model folder.
inline constexpr const char *kValueHeadFile = "value_head.safetensors";

class ValueHead : public torch::nn::Module {
public:
    /// Uninitialized float32 parameters for a trunk of width `hidden` on `device`.
    ValueHead(int64_t hidden, at::Device device);

    /// weight ~ normal(0, std) drawn on the CPU from `seed`, bias 0.
    void init_weights(uint64_t seed, double std = 0.02);

    /// Values [T] (float32) of hidden states [T, hidden] (any float dtype);
    /// differentiable w.r.t. the head and the hidden states.
    at::Tensor forward(const at::Tensor &hidden) const;

    /// ("value_head.weight", ...), ("value_head.bias", ...).
    std::vector<std::pair<std::string, at::Tensor>> named_weights() const;

    /// Writes `file` atomically.
    void save(const std::string &file) const;
    /// The head's tensors from `file`; errors name the file and tensor
    /// (missing, unexpected, wrong shape).
    std::map<std::string, at::Tensor> read(const std::string &file) const;
    /// Reads `file` and copies its tensors into the parameters.
    void load(const std::string &file);

    int64_t hidden_size() const { return hidden_; }
    at::Tensor weight; ///< [1, hidden] float32
    at::Tensor bias;   ///< [1] float32

private:
    int64_t hidden_;
};

} // namespace rl::core
