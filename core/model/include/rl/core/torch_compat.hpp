// The one place where libtorch version differences live: the build accepts
// any libtorch >= 2.4 (the pinned wheel, or the torch of a GPU machine).
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <optional>

#define RL_TORCH_AT_LEAST(major, minor)                                                            \
    (TORCH_VERSION_MAJOR > (major) ||                                                              \
     (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace rl::core::compat {

/// at::scaled_dot_product_attention with grouped key/value heads: q
/// [n, H, Lq, D], k and v [n, KVH, Lk, D] (H a multiple of KVH). Fused
/// kernels: flash / memory-efficient on CUDA, flash on the CPU (when there is
/// no mask). mask: additive or boolean, broadcastable to [n, H, Lq, Lk], or
/// undefined. libtorch >= 2.5 reads grouped heads in place (enable_gqa);
/// 2.4 repeats them.
inline at::Tensor sdpa(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                       const at::Tensor &mask, bool is_causal, double scale) {
    const std::optional<at::Tensor> m =
        mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
#if RL_TORCH_AT_LEAST(2, 5)
    return at::scaled_dot_product_attention(q, k, v, m, 0.0, is_causal, scale,
                                            /*enable_gqa=*/k.size(1) != q.size(1));
#else
    const int64_t rep = q.size(1) / k.size(1);
    if (rep == 1) return at::scaled_dot_product_attention(q, k, v, m, 0.0, is_causal, scale);
    return at::scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                            v.repeat_interleave(rep, 1), m, 0.0, is_causal, scale);
#endif
}

/// Optional scalar type for the unsigned safetensors dtypes (U16, U32, U64).
inline std::optional<at::ScalarType> wide_unsigned_type(int bits) {
#if RL_TORCH_AT_LEAST(2, 3)
    switch (bits) {
        case 16:
            return c10::ScalarType::UInt16;
        case 32:
            return c10::ScalarType::UInt32;
        case 64:
            return c10::ScalarType::UInt64;
        default:
            return std::nullopt;
    }
#else
    (void)bits;
    return std::nullopt;
#endif
}

} // namespace rl::core::compat
