// The one place where libtorch version differences live. Debian ships 1.13 for
// CPU builds; GPU machines bring the libtorch of their PyTorch (2.x).
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <optional>

#define RL_TORCH_AT_LEAST(major, minor)                                                            \
    (TORCH_VERSION_MAJOR > (major) ||                                                              \
     (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace rl::core::compat {

/// at::scaled_dot_product_attention exists from 2.0 (fused flash / memory
/// efficient kernels on CUDA).
constexpr bool kHasSdpa = RL_TORCH_AT_LEAST(2, 0);

/// Unsigned 16/32/64-bit tensors exist from 2.3.
constexpr bool kHasWideUnsigned = RL_TORCH_AT_LEAST(2, 3);

/// Causal attention over equal-length padded sequences with the fused kernel
/// when there is one: q [B, H, L, D], k and v [B, H, L, D] (heads already
/// expanded). Returns std::nullopt where this libtorch has no fused kernel.
inline std::optional<at::Tensor> fused_causal_attention(const at::Tensor &q, const at::Tensor &k,
                                                        const at::Tensor &v) {
#if RL_TORCH_AT_LEAST(2, 0)
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true);
#else
    (void)q;
    (void)k;
    (void)v;
    return std::nullopt;
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
