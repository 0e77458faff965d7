// Helpers of the platform tests: a tiny model on a chosen device and dtype, a
// batch, and a plain cross-entropy loss, all through the C++ core (no plugins).
#pragma once

#include "../core/small_tiny_spec.hpp"
#include "../core/test_util.hpp"

#include "rl/core/engine.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

namespace rl::core::test {

/// The tiny model (same seed, same weights) loaded on `device` in `dtype`.
inline std::shared_ptr<Policy> tiny_policy(const TempDir &dir, at::ScalarType dtype,
                                           at::Device device = at::kCPU) {
    const std::string path = dir / "tiny";
    if (!std::filesystem::exists(path + "/config.json")) write_tiny_model(path, 7);
    LoadOptions o;
    o.dtype = dtype;
    o.device = device;
    return Policy::load(path, o);
}

/// Sequences of random tiny-vocabulary tokens with a loss mask on all but
/// the first quarter of each.
inline TrainBatch random_batch(int64_t seqs, int64_t len, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t> ids, mask;
    TrainBatch b;
    b.cu_seqlens.push_back(0);
    for (int64_t s = 0; s < seqs; ++s) {
        const int64_t n = len - static_cast<int64_t>(rng() % 5);
        for (int64_t t = 0; t < n; ++t) {
            ids.push_back(static_cast<int64_t>(rng() % 256));
            mask.push_back(t >= n / 4 ? 1 : 0);
        }
        b.cu_seqlens.push_back(static_cast<int64_t>(ids.size()));
    }
    b.input_ids = at::tensor(ids, at::kLong);
    b.tensors["loss_mask"] = at::tensor(mask, at::kLong);
    return b;
}

/// Every sample of `g` as prompt + completion in one batch; `start` gets the
/// position of each sample's first completion token.
inline TrainBatch generation_batch(const std::vector<std::vector<int64_t>> &prompts,
                                   const Generation &g, std::vector<int64_t> &start) {
    TrainBatch b;
    std::vector<int64_t> ids;
    b.cu_seqlens.push_back(0);
    for (int64_t s = 0; s < g.samples(); ++s) {
        const auto &p = prompts[static_cast<size_t>(g.prompt_index[static_cast<size_t>(s)])];
        ids.insert(ids.end(), p.begin(), p.end());
        start.push_back(static_cast<int64_t>(ids.size()));
        ids.insert(ids.end(), g.token_ids.begin() + g.cu_seqlens[s],
                   g.token_ids.begin() + g.cu_seqlens[s + 1]);
        b.cu_seqlens.push_back(static_cast<int64_t>(ids.size()));
    }
    b.input_ids = at::tensor(ids, at::kLong);
    return b;
}

/// Mean negative log-likelihood of the masked tokens (every token without a
/// loss_mask).
inline LossFunction nll_loss() {
    LossFunction f;
    f.name = "loss 'nll'";
    f.signature.required = {"logprobs"};
    f.signature.optional = {"loss_mask"};
    f.signature.differentiable = {"logprobs"};
    f.compute = [](const LossCall &call) {
        at::Tensor lp, mask;
        for (const auto &kv : call.tensors) {
            if (kv.first == "logprobs") lp = kv.second;
            if (kv.first == "loss_mask") mask = kv.second;
        }
        if (!mask.defined()) mask = at::ones_like(lp);
        LossResult r;
        r.loss = -(lp * mask).sum().item<double>() / call.global_tokens;
        if (call.want_grads) r.grads["logprobs"] = -mask / call.global_tokens;
        return r;
    };
    return f;
}

/// Parameters by name, as float64 host copies.
inline std::map<std::string, at::Tensor> parameters_of(const Policy &p) {
    std::map<std::string, at::Tensor> out;
    for (const auto &kv : p.model().named_weights())
        out[kv.first] = kv.second.detach().to(at::kCPU).to(at::kDouble);
    return out;
}

/// Largest |a - b| over every parameter.
inline double max_difference(const std::map<std::string, at::Tensor> &a,
                             const std::map<std::string, at::Tensor> &b) {
    double m = 0;
    for (const auto &kv : a)
        m = std::max(m, (kv.second - b.at(kv.first)).abs().max().item<double>());
    return m;
}

} // namespace rl::core::test
