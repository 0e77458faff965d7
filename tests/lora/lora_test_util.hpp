// Helpers of the LoRA suites (lora_test.cpp, lora_moe_test.cpp): seeded tiny
// models, byte-level text batches, parameter snapshots, a few training steps
// and the engine's sampling with an adapter.
#pragma once

#include "../platform/platform_util.hpp"

#include "rl/core/policy.hpp"
#include "rl/core/sampling.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rl::core::test {

// A fresh policy over the tiny model of `spec` drawn from `seed`, written to
// `dir` by the first call.
inline std::shared_ptr<Policy> seeded_policy(const std::string &dir, uint64_t seed,
                                             const TinyModelSpec &spec) {
    if (!std::filesystem::exists(std::filesystem::path(dir) / "config.json"))
        write_tiny_model(dir, seed, spec);
    return Policy::load(dir);
}

// One sequence per text, its bytes as token ids.
inline TrainBatch text_batch(const std::vector<std::string> &texts) {
    std::vector<int64_t> ids, cu{0};
    for (const auto &t : texts) {
        for (unsigned char c : t) ids.push_back(c);
        cu.push_back(static_cast<int64_t>(ids.size()));
    }
    TrainBatch b;
    b.input_ids = at::tensor(ids, at::kLong);
    b.cu_seqlens = cu;
    return b;
}

// Detached copies of named parameters, by name.
inline std::map<std::string, at::Tensor>
snapshot(const std::vector<std::pair<std::string, at::Tensor>> &v) {
    std::map<std::string, at::Tensor> out;
    for (const auto &kv : v) out[kv.first] = kv.second.detach().clone();
    return out;
}

// `steps` optimizer steps of next-token cross-entropy on `texts`.
inline void train_steps(Trainer &t, int steps, const std::vector<std::string> &texts) {
    const LossFunction ce = nll_loss();
    for (int i = 0; i < steps; ++i) {
        t.forward_backward(text_batch(texts), ce);
        t.optim_step();
    }
}

inline TrainerConfig lora_trainer_config() {
    TrainerConfig c;
    c.learning_rate = 1e-2;
    return c;
}

// Two samples of up to 12 tokens from seed 3 with the adapter `adapter`, no
// stop tokens.
inline SamplingParams adapter_sampling(const std::string &adapter) {
    SamplingParams sp;
    sp.adapter = adapter;
    sp.max_tokens = 12;
    sp.seed = 3;
    sp.n = 2;
    sp.stop_token_ids = std::vector<int64_t>{};
    return sp;
}

} // namespace rl::core::test
