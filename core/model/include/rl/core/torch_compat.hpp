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

/// Whether at::_flash_attention_forward takes packed variable-length
/// sequences (cumulative lengths) with a differentiable output here.
#if RL_TORCH_AT_LEAST(2, 5)
constexpr bool kHasVarlenFlash = true;
#else
constexpr bool kHasVarlenFlash = false;
#endif

/// Causal flash attention over packed sequences: q [T, H, D], k and v
/// [T, KVH, D] (H a multiple of KVH, read in place), cu_seqlens int32 [S + 1]
/// on the device, max_len the longest sequence. Returns [T, H, D]; each token
/// attends to the earlier tokens of its own sequence only. Differentiable.
/// CUDA, bfloat16 / float16 only (see varlen_attention_available).
inline at::Tensor varlen_flash_attention(const at::Tensor &q, const at::Tensor &k,
                                         const at::Tensor &v, const at::Tensor &cu_seqlens,
                                         int64_t max_len, double scale) {
#if RL_TORCH_AT_LEAST(2, 5)
    return std::get<0>(at::_flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_len,
                                                    max_len, /*dropout_p=*/0.0,
                                                    /*is_causal=*/true,
                                                    /*return_debug_mask=*/false, scale));
#else
    (void)k, (void)v, (void)cu_seqlens, (void)max_len, (void)scale;
    return q;
#endif
}

/// a [M, K] @ b [K, N] in float32. Low-precision (bfloat16 / float16) CUDA
/// operands stay in their dtype and multiply on the tensor cores with float32
/// accumulation and a float32 result (no rounding of the product to the
/// input dtype, no float32 copy of the operands); anything else is converted
/// to float32 first.
inline at::Tensor mm_float(const at::Tensor &a, const at::Tensor &b) {
#if RL_TORCH_AT_LEAST(2, 9)
    const auto t = a.scalar_type();
    if (a.is_cuda() && (t == at::kBFloat16 || t == at::kHalf) && b.scalar_type() == t)
        return at::mm(a, b, at::kFloat);
#endif
    auto f = [](const at::Tensor &x) {
        return x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
    };
    return at::mm(f(a), f(b));
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
