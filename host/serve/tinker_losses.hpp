// host/serve/tinker_losses.hpp: Tinker's built-in losses (cross_entropy,
// importance_sampling, ppo, cispo) as trainer losses. All are sums over tokens
// (not means), as Tinker defines them; the per-token inputs arrive aligned to
// the trainer's tokens (training_server.cpp shifts Tinker's datums by one):
//
//   weights            per-token weight (cross_entropy; a multiplier, default 1, for the others)
//   sampling_logprobs  Tinker's loss input "logprobs": the sampler's logprobs
//   advantages         per-token advantages
//
// Every loss also emits the per-token "logprobs" (the trainer's, what Tinker
// returns in loss_fn_outputs) and "elementwise_loss".
#pragma once

#include "rl/core/trainer.hpp"

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace rl::serve::tinker {

/// The built-in loss `name` configured by `config` (Tinker's loss_fn_config);
/// none when `name` is not built in. Unknown or out-of-range config keys are
/// ApiError 400 naming "loss_fn_config.<key>".
std::optional<core::LossFunction> builtin_loss(const std::string &name,
                                               const nlohmann::json &config);

/// The names builtin_loss knows.
const std::vector<std::string> &builtin_loss_names();

/// The Tinker loss inputs (loss_fn_inputs keys) a built-in loss reads:
/// required first, then optional.
struct BuiltinInputs {
    std::vector<std::string> required, optional;
};
BuiltinInputs builtin_inputs(const std::string &name);

} // namespace rl::serve::tinker
