#include "rl/core/packing.hpp"

#include "rl/core/error.hpp"

#include <string>

namespace rl::core {

PackingPlan plan_packing(const std::vector<int64_t> &cu, const PackingConfig &config) {
    using std::to_string;
    require(config.sample_packing_sequence_len > 0, ErrorKind::InvalidArgument,
            "trainer.sample_packing_sequence_len must be positive, got " +
                to_string(config.sample_packing_sequence_len));
    require(config.micro_batch_tokens > 0, ErrorKind::InvalidArgument,
            "trainer.micro_batch_tokens must be positive, got " +
                to_string(config.micro_batch_tokens));
    require(cu.size() >= 2, ErrorKind::InvalidArgument,
            "cu_seqlens must hold at least 2 entries (one sequence), got " + to_string(cu.size()));
    require(cu[0] == 0, ErrorKind::InvalidArgument,
            "cu_seqlens[0] must be 0, got " + to_string(cu[0]));
    const int64_t n = static_cast<int64_t>(cu.size()) - 1;
    const int64_t cap = config.sample_packing_sequence_len;

    PackingPlan plan;
    for (int64_t s = 0; s < n; ++s) {
        const int64_t len = cu[s + 1] - cu[s];
        require(len > 0, ErrorKind::InvalidArgument,
                "sequence " + to_string(s) + " is empty (cu_seqlens[" + to_string(s) +
                    "] = " + to_string(cu[s]) + ", cu_seqlens[" + to_string(s + 1) +
                    "] = " + to_string(cu[s + 1]) + ")");
        require(
            len <= cap, ErrorKind::InvalidArgument,
            "sequence " + to_string(s) + " has " + to_string(len) +
                " tokens, more than a packing bin holds (trainer.sample_packing_sequence_len = " +
                to_string(cap) + ")");
        const bool open =
            !plan.bins.empty() && config.enable_packing && plan.bins.back().tokens() + len <= cap;
        if (open) {
            plan.bins.back().end_seq = s + 1;
            plan.bins.back().token_end = cu[s + 1];
        } else {
            plan.bins.push_back({s, s + 1, cu[s], cu[s + 1]});
        }
    }

    // Consecutive bins while their tokens fit the budget; a bin larger than
    // the budget runs alone.
    const int64_t budget = config.micro_batch_tokens;
    for (int64_t b = 0; b < static_cast<int64_t>(plan.bins.size()); ++b) {
        const SeqRange &bin = plan.bins[static_cast<size_t>(b)];
        const bool join = !plan.micro_batches.empty() &&
                          plan.micro_batches.back().range.tokens() + bin.tokens() <= budget;
        if (join) {
            MicroBatch &mb = plan.micro_batches.back();
            mb.range.end_seq = bin.end_seq;
            mb.range.token_end = bin.token_end;
            mb.end_bin = b + 1;
        } else {
            plan.micro_batches.push_back({bin, b, b + 1});
        }
    }
    return plan;
}

} // namespace rl::core
