// The data of the distributed parity tests: a small model, a loss, and a
// global batch per step that each rank takes an uneven share of.
#pragma once

#include "../core/small_tiny_spec.hpp"

#include "rl/core/model.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>

#include <memory>
#include <random>
#include <vector>

namespace rl_dist_test {

inline std::shared_ptr<rl::core::Policy> tiny_policy() {
    const rl::core::TinyModelSpec spec = rl::core::test::small_tiny_spec(3);
    auto model = std::make_shared<rl::core::CausalLM>(
        rl::core::ModelConfig::parse(rl::core::tiny_config_json(spec)));
    model->init_weights(7);
    return std::make_shared<rl::core::Policy>(model, nullptr);
}

// Qwen3-MoE, 2 sparse layers of 4 experts (top-2) of width 32.
inline std::shared_ptr<rl::core::Policy> tiny_moe_policy() {
    rl::core::TinyModelSpec spec = rl::core::test::small_tiny_spec(2);
    spec.num_experts = 4;
    spec.num_experts_per_tok = 2;
    spec.moe_intermediate_size = 32;
    auto model = std::make_shared<rl::core::CausalLM>(
        rl::core::ModelConfig::parse(rl::core::tiny_config_json(spec)));
    model->init_weights(7);
    return std::make_shared<rl::core::Policy>(model, nullptr);
}

inline rl::core::TrainerConfig trainer_config() {
    rl::core::TrainerConfig c;
    c.learning_rate = 1e-3;
    c.weight_decay = 0.01;
    c.gradient_clip = 0.5;
    c.packing.sample_packing_sequence_len = 32;
    c.packing.micro_batch_tokens = 32;
    return c;
}

// Sequence s of the global half-batch (step, half): tokens and advantages.
struct Seq {
    std::vector<int64_t> ids;
    std::vector<float> adv;
};

inline std::vector<Seq> global_half_batch(int step, int half) {
    std::mt19937 gen(static_cast<unsigned>(1000 * step + 10 * half + 1));
    std::vector<Seq> out;
    for (int s = 0; s < 6; ++s) {
        const int len = 5 + static_cast<int>(gen() % 20);
        Seq q;
        for (int t = 0; t < len; ++t) {
            q.ids.push_back(static_cast<int64_t>(gen() % rl::core::kTinyVocabSize));
            q.adv.push_back(static_cast<float>(static_cast<int>(gen() % 2001) - 1000) / 1000.0f);
        }
        out.push_back(std::move(q));
    }
    return out;
}

// Rank r's share: all of it for one rank; 4 + 2 sequences for two ranks;
// 2 + 2 + 1 + 1 for four.
inline rl::core::TrainBatch rank_batch(int step, int half, int rank, int world) {
    const std::vector<Seq> all = global_half_batch(step, half);
    size_t begin = 0, end = all.size();
    if (world == 2) {
        begin = rank == 0 ? 0 : 4;
        end = rank == 0 ? 4 : all.size();
    }
    if (world == 4) {
        const size_t starts[] = {0, 2, 4, 5, 6};
        begin = starts[rank];
        end = starts[rank + 1];
    }
    std::vector<int64_t> ids, cu{0};
    std::vector<float> adv;
    for (size_t s = begin; s < end; ++s) {
        ids.insert(ids.end(), all[s].ids.begin(), all[s].ids.end());
        adv.insert(adv.end(), all[s].adv.begin(), all[s].adv.end());
        cu.push_back(static_cast<int64_t>(ids.size()));
    }
    rl::core::TrainBatch b;
    b.input_ids = at::tensor(ids, at::kLong);
    b.cu_seqlens = cu;
    b.tensors["advantages"] = at::tensor(adv, at::kFloat);
    return b;
}

// A routing to replay for the tiny MoE model (2 sparse layers, 4 experts,
// top-2), a function of each token's id: every fifth id routes itself.
inline at::Tensor routed_experts_of(const at::Tensor &ids) {
    const int64_t T = ids.size(0);
    at::Tensor out = at::empty({T, 2, 2}, at::kLong);
    for (int64_t t = 0; t < T; ++t) {
        const int64_t v = ids[t].item<int64_t>();
        for (int64_t l = 0; l < 2; ++l) {
            out[t][l][0] = v % 5 == 0 ? -1 : (v + l) % 4;
            out[t][l][1] = v % 5 == 0 ? -1 : (v + l + 1 + v % 3) % 4; // never slot 0's
        }
    }
    return out;
}

// Loss tokens of the global half-batch (every token but each sequence's first).
// Half 1 passes it explicitly, half 0 lets the trainer sum the ranks' counts.
inline double global_loss_tokens(int step, int half) {
    if (half == 0) return 0;
    double n = 0;
    for (const auto &s : global_half_batch(step, half)) n += static_cast<double>(s.ids.size()) - 1;
    return n;
}

// loss = -sum_t adv_t * mask_t * logprob_t / global_tokens
inline rl::core::LossFunction weighted_logprob_loss() {
    rl::core::LossFunction f;
    f.name = "loss 'weighted_logprob'";
    f.signature.required = {"logprobs", "advantages"};
    f.signature.optional = {"loss_mask"};
    f.signature.differentiable = {"logprobs"};
    f.compute = [](const rl::core::LossCall &call) {
        at::Tensor lp, adv, mask;
        for (const auto &kv : call.tensors) {
            if (kv.first == "logprobs") lp = kv.second;
            if (kv.first == "advantages") adv = kv.second;
            if (kv.first == "loss_mask") mask = kv.second;
        }
        if (!mask.defined()) mask = at::ones_like(lp);
        rl::core::LossResult r;
        at::Tensor w = adv * mask / call.global_tokens;
        r.loss = -(w * lp).sum().item<double>();
        if (call.want_grads) r.grads["logprobs"] = -w;
        // One metric of each declared reduction, over the call's masked tokens.
        using R = rl::core::MetricReduce;
        const at::Tensor on = mask > 0;
        const double n = on.sum().item<double>();
        if (n > 0) {
            const at::Tensor v = lp.detach().masked_select(on).to(at::kDouble);
            r.metrics["lp_min"] = v.min().item<double>();
            r.reductions["lp_min"] = {R::Min, n};
            r.metrics["lp_max"] = v.max().item<double>();
            r.reductions["lp_max"] = {R::Max, n};
            r.metrics["lp_token_mean"] = v.mean().item<double>();
            r.reductions["lp_token_mean"] = {R::TokenMean, n};
        }
        r.metrics["masked_tokens"] = n;
        r.reductions["masked_tokens"] = {R::Sum, n};
        return r;
    };
    return f;
}

} // namespace rl_dist_test
