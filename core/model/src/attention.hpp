// Attention for packed sequences and for the KV cache. On a CUDA device with
// bfloat16 / float16 activations (compute capability 8.0 and up), packed
// sequences go through the variable-length flash kernel: the tokens stay
// packed, each sequence attends only to itself, and nothing is padded.
// Otherwise a set of sequences is padded to a common length and runs one
// attention per group (at::scaled_dot_product_attention on CUDA, batched
// matrix products on the CPU), so many short sequences (the RL case) cost a
// few large kernels, not a loop, and no token attends across sequences.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace rl::core {

/// Softmax attention with grouped key/value heads, as explicit matrix
/// products: q [n, H, Lq, D], k and v [n, KVH, Lk, D] (query head h reads
/// key/value head h / (H / KVH)); mask additive [Lq, Lk] or [n, 1, Lq, Lk],
/// or undefined. Returns [n, H, Lq, D].
at::Tensor grouped_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                             const at::Tensor &mask, double scale);

/// The attention the model runs: at::scaled_dot_product_attention (fused
/// flash / memory-efficient kernels) on CUDA, grouped_attention on the CPU.
/// `mask` is used on the CPU always and on CUDA when defined; is_causal adds
/// the causal mask on CUDA (on the CPU `mask` must then hold it).
at::Tensor attend(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                  const at::Tensor &mask, bool is_causal, double scale);

/// How packed sequences are grouped and padded. Built once per forward and
/// shared by every layer.
struct PackedAttentionPlan {
    struct Group {
        int64_t n = 0;     ///< sequences
        int64_t len = 0;   ///< padded length
        at::Tensor gather; ///< [n * len] token index per padded row (undefined: identity)
        at::Tensor valid;  ///< [tokens of the group] padded row per token (undefined: all)
        at::Tensor mask;   ///< [len, len] additive causal mask (CPU), undefined on CUDA
    };
    std::vector<Group> groups;
    at::Tensor unpermute; ///< restores token order after concatenating groups (undefined: identity)
    int64_t tokens = 0;
    /// Variable-length flash attention over the packed tokens (no groups):
    /// cu_seqlens as int32 on the device, and the longest sequence.
    bool varlen = false;
    at::Tensor cu_seqlens;
    int64_t max_len = 0;
};

/// Whether packed attention with these shapes runs the variable-length flash
/// kernel: CUDA, compute capability >= 8.0, bfloat16 or float16, head
/// dimension a multiple of 8 up to 256, and a libtorch that has the kernel.
bool varlen_attention_available(at::Device device, at::ScalarType dtype, int64_t head_dim);

/// cu: cumulative sequence lengths (host copy). With `varlen` (see
/// varlen_attention_available) the plan keeps the tokens packed. Otherwise
/// sequences are sorted by length and grouped so that padding stays below
/// ~1.8x of the attention work, with the score matrix of a group bounded in
/// memory.
PackedAttentionPlan plan_packed_attention(const std::vector<int64_t> &cu, int64_t heads,
                                          at::Device device, bool varlen = false);

/// q [T, H, D], k and v [T, KVH, D] -> [T, H * D].
at::Tensor packed_attention(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                            const PackedAttentionPlan &plan, double scale);

/// Plan for appending chunks to KV cache slots.
struct CachedAttentionPlan {
    std::vector<int64_t> slots;
    int64_t n = 0;
    int64_t q_len = 0;       ///< longest chunk
    int64_t k_len = 0;       ///< longest slot after the append
    int64_t first_slot = -1; ///< >= 0 when slots are consecutive (no gather of the cache)
    at::Tensor slot_index;   ///< [n] slots as a tensor (for index_select)
    at::Tensor write_index;  ///< [T * KVH] flat row of each new key in [S*KVH*Cap, D]
    at::Tensor gather;       ///< [n * q_len] token per padded query row (undefined: identity)
    at::Tensor valid;        ///< [T] padded row per token (undefined: all)
    at::Tensor mask;         ///< [n, 1, q_len, k_len] additive; undefined: all visible
};

CachedAttentionPlan plan_cached_attention(const std::vector<int64_t> &slots,
                                          const std::vector<int64_t> &starts,
                                          const std::vector<int64_t> &counts, int64_t kv_heads,
                                          int64_t capacity, at::ScalarType dtype,
                                          at::Device device);

/// Writes k_new, v_new [T, KVH, D] into the cache and attends q [T, H, D] to
/// the slot contents. cache_k / cache_v: [S, KVH, Cap, D]. Returns [T, H * D].
at::Tensor cached_attention(const at::Tensor &q, const at::Tensor &k_new, const at::Tensor &v_new,
                            at::Tensor &cache_k, at::Tensor &cache_v,
                            const CachedAttentionPlan &plan, double scale);

} // namespace rl::core
