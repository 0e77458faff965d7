// Rotary position embedding with the transformers layout (rotate_half over
// the two halves of each head) and the none / linear / llama3 frequency rules.
#pragma once

#include "rl/core/config.hpp"

#include <ATen/Tensor.h>

#include <utility>

namespace rl::core {

class RotaryEmbedding {
public:
    explicit RotaryEmbedding(const ModelConfig &config);

    /// cos and sin [T, head_dim / 2] in `dtype` for position ids [T] (int64).
    /// Computed in fp32 as transformers does, then cast. On CUDA the tables
    /// are full width instead, [T, head_dim]: cos | cos and -sin | sin, which
    /// apply() uses to rotate in three kernels rather than seven.
    std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor &position_ids,
                                              at::ScalarType dtype) const;
    /// x [T, heads, head_dim] rotated by the tables of cos_sin().
    static at::Tensor apply(const at::Tensor &x, const at::Tensor &cos, const at::Tensor &sin);
    /// q and k rotated alike: on CUDA one fused kernel for both
    /// (fused_ops.hpp), else apply() to each.
    static std::pair<at::Tensor, at::Tensor> apply(const at::Tensor &q, const at::Tensor &k,
                                                   const at::Tensor &cos, const at::Tensor &sin);

    /// [head_dim / 2] fp32 on the CPU.
    const at::Tensor &inv_freq() const { return inv_freq_; }

private:
    at::Tensor inv_freq_;
};

} // namespace rl::core
