// Fused CUDA kernels for the eager model's elementwise and vocabulary-wide
// work (fused_kernels.hpp), as libtorch operations with their backward.
// They run for CUDA tensors in float32, float16 or bfloat16 when the build
// compiled the kernels (nvcc found at configure time) and RL_FUSED_KERNELS is
// not "0"; everything else keeps the eager libtorch path, which is also the
// reference the `cuda` tests compare them with.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <utility>

namespace rl::core::fused {

/// Whether this build has the kernels.
bool compiled();
/// Whether they are switched on: RL_FUSED_KERNELS=0 in the environment at
/// the first call, or set_enabled(false), switches them off (for side-by-side
/// measurements and tests).
bool enabled();
void set_enabled(bool on);
/// compiled() && enabled() && x is a CUDA tensor of float32, float16 or
/// bfloat16.
bool applies(const at::Tensor &x);

/// silu(gate) * up, one kernel forward and one backward (d gate and d up
/// together). gate and up: same shape and dtype.
at::Tensor swiglu(const at::Tensor &gate, const at::Tensor &up);

/// Rotary embedding of q [T, heads, head_dim] and k [T, kv_heads, head_dim]
/// with full-width tables [T, head_dim] (RotaryEmbedding::cos_sin on CUDA):
/// one kernel for both forward, one backward. Differentiable in q and k (the
/// tables are constants).
std::pair<at::Tensor, at::Tensor> rope(const at::Tensor &q, const at::Tensor &k,
                                       const at::Tensor &cos, const at::Tensor &sin);

/// Whether qk_norm_rope runs for q [T, heads, head_dim] and norm weight w:
/// applies(q), a head_dim the kernel takes (64, 128, 256, 512) and w of q's
/// dtype.
bool norm_rope_applies(const at::Tensor &q, const at::Tensor &w);

/// Qwen3's q_norm / k_norm (RMSNorm over each head with weights wq, wk and
/// eps) followed by the rotary embedding (full-width tables as for rope()),
/// for q and k in one kernel forward and one backward. Differentiable in q,
/// k, wq and wk. Same values as at::rms_norm then rope() (the normalized
/// value is rounded to the dtype in between).
std::pair<at::Tensor, at::Tensor> qk_norm_rope(const at::Tensor &q, const at::Tensor &k,
                                               const at::Tensor &wq, const at::Tensor &wk,
                                               double eps, const at::Tensor &cos,
                                               const at::Tensor &sin);

/// Per-row statistics of float32 logits z [n, vocab] (already divided by the
/// temperature) in one read: writes lse, logprob (0 where labels ==
/// ignore_index) and, when defined, entropy and lse_raw (log Z of z /
/// inv_temp). All outputs float32 [n], contiguous.
void logit_stats(const at::Tensor &z, const at::Tensor &labels, int64_t ignore_index,
                 double inv_temp, const at::Tensor &lse, const at::Tensor &logprob,
                 const at::Tensor &entropy, const at::Tensor &lse_raw);

/// d z of those statistics (fused_kernels.hpp gives the formula), written
/// once into dz [n, vocab] (any of float32 / float16 / bfloat16, rows may be
/// strided). g_entropy, g_lse_raw (and their entropy, lse_raw) and g_logprob
/// may be undefined; labels must be in range (g_logprob 0 where ignored).
void logit_grad(const at::Tensor &z, const at::Tensor &labels, const at::Tensor &lse,
                const at::Tensor &g_logprob, const at::Tensor &g_entropy, const at::Tensor &entropy,
                const at::Tensor &g_lse_raw, const at::Tensor &lse_raw, double inv_temp,
                const at::Tensor &dz);

} // namespace rl::core::fused
