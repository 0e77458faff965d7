// The fused CUDA kernels of the model core (cuda/fused_kernels.cu), as plain
// functions over device pointers: no libtorch here, so nvcc never parses ATen.
// Every function launches on `stream` (a cudaStream_t) and returns the
// cudaError_t of the launch (0 when it was queued); error_string names it.
// fused_ops.hpp is the libtorch side that checks shapes and calls these.
#pragma once

#include <cstdint>

namespace rl::core::cuda {

enum class DType { Float32, Float16, BFloat16 };

/// out = silu(gate) * up, elementwise over n values, in float32 with one
/// rounding to the dtype.
int swiglu_forward(DType t, const void *gate, const void *up, void *out, int64_t n, void *stream);

/// d gate = dy * up * s * (1 + gate * (1 - s)) and d up = dy * silu(gate),
/// s = sigmoid(gate).
int swiglu_backward(DType t, const void *dy, const void *gate, const void *up, void *dgate,
                    void *dup, int64_t n, void *stream);

/// Rotary embedding of q [tokens, q_heads, dim] and k [tokens, k_heads, dim]
/// (contiguous; k may be null) in one launch, with full-width tables
/// [tokens, dim]: cos = [c | c], sin = [-s | s] (rope.cpp). forward:
/// y = x * cos + swap_halves(x) * sin; backward (x = dy, y = dx): its
/// transpose, dx_d = dy_d cos_d + dy_p(d) sin_p(d), p(d) the partner of d in
/// the other half.
int rope(DType t, const void *q, void *q_out, int64_t q_heads, const void *k, void *k_out,
         int64_t k_heads, const void *cos, const void *sin, int64_t tokens, int64_t dim,
         bool backward, void *stream);

/// Qwen3's per-head RMSNorm of q and k followed by the rotary embedding, in
/// one launch for both (one warp per head row):
///   forward:  y = rope(round(x * rstd * w)), rstd = 1 / sqrt(mean(x^2) + eps)
///   backward: g = round(rope^T(dy)); dx = rstd (g w - x^ mean(g w x^)),
///             x^ = x rstd; and d w = sum over rows of g x^, written as one
///             row of partial sums per block into dw_partial [blocks, 2, dim]
///             (q's then k's), which the caller sums over blocks.
/// x [tokens, heads, dim] contiguous, w [dim], tables [tokens, dim] as for
/// rope(). dim must be 64, 128, 256 or 512 (norm_rope_supports).
struct NormRopeArgs {
    const void *q = nullptr, *k = nullptr;
    const void *q_weight = nullptr, *k_weight = nullptr;
    void *q_out = nullptr, *k_out = nullptr;     // forward: y; backward: d x
    const void *q_dy = nullptr, *k_dy = nullptr; // backward: d y
    int64_t q_heads = 0, k_heads = 0, tokens = 0, dim = 0;
    const void *cos = nullptr, *sin = nullptr;
    float eps = 1e-6f;
    float *dw_partial = nullptr; // null: forward
    int64_t blocks = 1;          // norm_rope_blocks(rows)
};
bool norm_rope_supports(int64_t dim);
int64_t norm_rope_blocks(int64_t rows);
int norm_rope(DType t, const NormRopeArgs &a, void *stream);

/// Per-row statistics of float32 logits z [rows, vocab] (contiguous, already
/// divided by the temperature), in one read of z:
///   lse = log sum_j exp z_j;  logprob = z_label - lse (0 where label ==
///   ignore_index);  entropy = lse - sum_j p_j z_j (when not null);
///   lse_raw = log sum_j exp(z_j / inv_temp) (when not null).
struct LogitStatsArgs {
    const float *z = nullptr;
    int64_t rows = 0, vocab = 0;
    const int64_t *labels = nullptr;
    int64_t ignore_index = -100;
    float inv_temp = 1.0f;
    float *lse = nullptr, *logprob = nullptr, *entropy = nullptr, *lse_raw = nullptr;
};
int logit_stats(const LogitStatsArgs &a, void *stream);

/// d loss / d z of the statistics above, with p = exp(z - lse):
///   dz_j = g_logprob (onehot_j - p_j) - g_entropy p_j (log p_j + entropy),
///   times inv_temp (z was divided by the temperature), plus
///   g_lse_raw softmax(z / inv_temp)_j. Null gradients contribute nothing.
/// labels must be in [0, vocab) (g_logprob 0 where a label is ignored).
/// dz [rows, dz_stride] in the given dtype, written once.
struct LogitGradArgs {
    const float *z = nullptr;
    int64_t rows = 0, vocab = 0;
    const int64_t *labels = nullptr;
    const float *lse = nullptr;
    const float *g_logprob = nullptr;
    const float *g_entropy = nullptr, *entropy = nullptr;
    const float *g_lse_raw = nullptr, *lse_raw = nullptr;
    float inv_temp = 1.0f;
    void *dz = nullptr;
    int64_t dz_stride = 0;
};
int logit_grad(DType t, const LogitGradArgs &a, void *stream);

const char *error_string(int code);

} // namespace rl::core::cuda
