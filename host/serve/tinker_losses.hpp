// host/serve/tinker_losses.hpp: Tinker's built-in loss names (cross_entropy,
// importance_sampling, ppo, cispo) as the loss plugins that implement them,
// so every loss name has one implementation, here and in the trainer:
//
//   cross_entropy        per_token_ce
//   importance_sampling  importance_sampling
//   ppo                  policy_loss (eps_clip = 1 - clip_low_threshold,
//                                     eps_clip_high = clip_high_threshold - 1)
//   cispo                cispo (clip_low / clip_high = the thresholds)
//
// each with loss_agg_mode "sum": Tinker's losses are sums over tokens. Tinker's
// loss inputs reach the plugin as: target_tokens -> labels, logprobs (the
// sampler's) -> old_logprobs, weights -> weights (a per-token multiplier),
// advantages -> advantages (training_server.cpp maps them).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace rl::serve::tinker {

/// The loss plugin behind one of Tinker's built-in names, and its parameters.
struct PluginLoss {
    std::string plugin;
    nlohmann::json params;
};

/// Tinker's built-in loss `name` configured by `config` (Tinker's
/// loss_fn_config) as a loss plugin call; none when `name` is not one of
/// Tinker's built-ins. Tinker's thresholds are translated (out of range: an
/// ApiError 400 naming "loss_fn_config.<key>"); other keys go to the plugin as
/// they are, and the plugin refuses those it does not take. loss_agg_mode
/// defaults to "sum".
std::optional<PluginLoss> builtin_plugin(const std::string &name, const nlohmann::json &config);

/// The names builtin_plugin knows.
const std::vector<std::string> &builtin_loss_names();

/// The Tinker loss inputs (loss_fn_inputs keys) a built-in loss reads:
/// required first, then optional.
struct BuiltinInputs {
    std::vector<std::string> required, optional;
};
BuiltinInputs builtin_inputs(const std::string &name);

} // namespace rl::serve::tinker
