// Helpers of the LoRA suites (lora_test.cpp, lora_moe_test.cpp): byte-level
// text batches, parameter snapshots and a few training steps.
#pragma once

#include "../platform/platform_util.hpp"

#include "rl/core/trainer.hpp"

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace rl::core::test {

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

} // namespace rl::core::test
