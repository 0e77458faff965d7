// What the trainer's files share: Trainer::Prepared (a checked batch), long_tensor, moe_aux_coef.
#pragma once

#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {

inline at::Tensor long_tensor(const std::vector<int64_t> &v) {
    at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
    std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
    return t;
}

// Mixture of experts: the load-balancing loss weight for this model (0: none).
inline double moe_aux_coef(const TrainerConfig &t, const ModelConfig &m) {
    if (!m.has_moe()) return 0.0;
    return t.moe_aux_loss_coef.value_or(m.output_router_logits ? m.router_aux_loss_coef : 0.0);
}

struct Trainer::Prepared {
    int64_t T = 0;
    std::vector<int64_t> cu;
    PackingPlan plan;
    at::Tensor ids;            // int64 [T]
    at::Tensor model_labels;   // int64 [T]: label of the next token in the sequence, else -100
    at::Tensor not_first;      // float32 [T]: 0 at each sequence's first token
    at::Tensor counted;        // float64 [T]: 1 where the loss counts the token
    at::Tensor routed;         // int64 [T, L_moe, K]: routing to replay (R3), else undefined
    at::Tensor routed_weights; // float32 [T, L_moe, K]: its recorded weights, else undefined
    // Loss inputs over the whole batch (float64, labels int64), sliced per micro-batch.
    std::vector<std::pair<std::string, at::Tensor>> inputs;
    bool want_logprobs = false, want_entropy = false;
    bool want_lse = false;    // "logsumexp" (z-loss)
    bool want_values = false; // from the value head
    int64_t loss_tokens = 0, loss_seqs = 0;
    double global_tokens = 0, global_seqs = 0;

    /// The model's input of one micro-batch: its tokens and their sequences'
    /// boundaries, relative to the micro-batch.
    PackedBatch input_of(const MicroBatch &mb) const {
        const int64_t a = mb.range.token_begin;
        std::vector<int64_t> cu_local;
        for (int64_t s = mb.range.first_seq; s <= mb.range.end_seq; ++s)
            cu_local.push_back(cu[static_cast<size_t>(s)] - a);
        PackedBatch pb;
        pb.input_ids = ids.narrow(0, a, mb.range.tokens());
        pb.cu_seqlens = long_tensor(cu_local);
        return pb;
    }
};

} // namespace rl::core
