// The training batch of abi/rl/step.h (rl_train_batch_t) and how one is made
// from buffered rollouts; shared by the step verbs and rl_buffer_pop_batch.
// Internal to librl.
#pragma once

#include "train_common.hpp"

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

struct rl_train_batch {
    rl::host::OwnedTensor input_ids, cu_seqlens;
    std::map<std::string, rl::host::OwnedTensor> tensors; // per-token
    std::vector<double> rewards;
    std::vector<int64_t> group_ids, policy_versions;
    std::vector<std::string> tasks, completions;
    int64_t groups = 0;
    // The temperature every rollout of the batch was sampled at (0: greedy);
    // unset when they carry none (rl_batch_t.sampling_temperature).
    std::optional<double> sampling_temperature;
    std::vector<rl_tensor_arg_t> args; // views of `tensors`, rebuilt on change

    void rebuild_args() {
        args.clear();
        for (const auto &kv : tensors) args.push_back({kv.first.c_str(), kv.second.view()});
    }
};

namespace rl::host::capi {

// The training batch of rollouts taken in order (pushed-rollout layout: prompt
// then completion, loss mask 0 on the prompt, sampling logprobs as
// "old_logprobs", the rollouts' common sampling temperature). Rollouts sampled
// at different temperatures (or some with one, some without) are refused: the
// trainer scores a batch at one temperature.
std::unique_ptr<rl_train_batch> batch_of(const std::vector<const rl::core::Rollout *> &rs,
                                         int64_t groups, const char *fn);

} // namespace rl::host::capi
