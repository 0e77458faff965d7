// rl/core/packing.hpp: greedy sequential packing and micro-batching.
//
// Sequences are taken in order and appended to the current bin while it has
// room for the whole sequence (bin capacity: sample_packing_sequence_len
// tokens); otherwise a new bin starts. Order is kept and no sequence is ever
// split, so every bin, and every micro-batch (consecutive bins whose tokens
// fit micro_batch_tokens), is a contiguous range of the input sequences. With
// packing off each bin holds one sequence. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

namespace rl::core {

struct PackingConfig {
    bool enable_packing = true;
    int64_t sample_packing_sequence_len = 2048; ///< tokens per bin
    int64_t micro_batch_tokens = 8192;          ///< tokens per forward / backward
};

/// Sequences [first_seq, end_seq) holding tokens [token_begin, token_end).
struct SeqRange {
    int64_t first_seq = 0;
    int64_t end_seq = 0;
    int64_t token_begin = 0;
    int64_t token_end = 0;
    int64_t tokens() const { return token_end - token_begin; }
    int64_t seqs() const { return end_seq - first_seq; }
};

struct MicroBatch {
    SeqRange range;
    int64_t first_bin = 0; ///< bins [first_bin, end_bin) of the packing
    int64_t end_bin = 0;
};

struct PackingPlan {
    std::vector<SeqRange> bins;
    std::vector<MicroBatch> micro_batches;
};

/// Checks cu_seqlens ([n_seqs + 1], starts at 0, strictly increasing: no
/// empty sequence) and packs. Throws Error naming the sequence index and
/// length when one is longer than a bin, or naming the bad cu_seqlens entry.
PackingPlan plan_packing(const std::vector<int64_t> &cu_seqlens, const PackingConfig &config);

} // namespace rl::core
