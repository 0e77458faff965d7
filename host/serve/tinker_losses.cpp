#include "tinker_losses.hpp"

#include "api.hpp"

#include <cmath>
#include <map>
#include <tuple>
#include <utility>

namespace rl::serve::tinker {

namespace {

using nlohmann::json;

// Tinker's threshold `key` (default `dflt`) after checking it lies in [min, max].
double threshold(const json &config, const std::string &loss, const char *key, double dflt,
                 double min, double max, const char *range) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return dflt;
    const std::string field = std::string("loss_fn_config.") + key;
    if (!it->is_number()) throw ApiError(400, field + " must be a number for " + loss, field);
    const double v = it->get<double>();
    if (!std::isfinite(v) || v < min || v > max)
        throw ApiError(400, field + " = " + it->dump() + " is outside " + range + " for " + loss,
                       field);
    return v;
}

void check_order(double lo, double hi) {
    if (lo > hi)
        throw ApiError(400, "loss_fn_config.clip_low_threshold must not exceed clip_high_threshold",
                       "loss_fn_config.clip_low_threshold");
}

} // namespace

const std::vector<std::string> &builtin_loss_names() {
    static const std::vector<std::string> names{"cross_entropy", "importance_sampling", "ppo",
                                                "cispo"};
    return names;
}

BuiltinInputs builtin_inputs(const std::string &name) {
    if (name == "cross_entropy") return {{"target_tokens"}, {"weights"}};
    return {{"target_tokens", "logprobs", "advantages"}, {"weights"}};
}

std::optional<PluginLoss> builtin_plugin(const std::string &name, const json &config) {
    static const std::map<std::string, std::string> plugin_of{
        {"cross_entropy", "per_token_ce"},
        {"importance_sampling", "importance_sampling"},
        {"ppo", "policy_loss"},
        {"cispo", "cispo"}};
    auto it = plugin_of.find(name);
    if (it == plugin_of.end()) return std::nullopt;
    PluginLoss out{it->second, json::object()};
    for (const auto &item : config.items())
        if (item.key() != "clip_low_threshold" && item.key() != "clip_high_threshold")
            out.params[item.key()] = item.value();
    if (!out.params.contains("loss_agg_mode")) out.params["loss_agg_mode"] = "sum";
    // Tinker's thresholds, when given, become the plugin's bounds; the
    // plugins' defaults are Tinker's (ppo 0.8 / 1.2, cispo 0 / 4).
    const bool low = config.contains("clip_low_threshold");
    const bool high = config.contains("clip_high_threshold");
    if (name == "ppo" || name == "cispo") {
        const bool ppo = name == "ppo";
        const char *low_key = ppo ? "eps_clip" : "clip_low";
        const char *high_key = ppo ? "eps_clip_high" : "clip_high";
        for (const auto &[given, tinker_key, key] :
             {std::tuple{low, "clip_low_threshold", low_key},
              std::tuple{high, "clip_high_threshold", high_key}})
            if (given && config.contains(key))
                throw ApiError(400,
                               std::string("loss_fn_config: give either ") + tinker_key + " or " +
                                   key + " (the same bound of " + name + "), not both",
                               std::string("loss_fn_config.") + tinker_key);
        // -sum(min(r A, clip(r, lo, hi) A)) is policy_loss with eps = 1 - lo, eps_high = hi - 1.
        const double lo =
            ppo ? threshold(config, name, "clip_low_threshold", 0.8, 1e-9, 1.0, "(0, 1]")
                : threshold(config, name, "clip_low_threshold", 0.0, 0, 1e9, "[0, 1e9]");
        const double hi =
            ppo ? threshold(config, name, "clip_high_threshold", 1.2, 1.0, 1e9, "[1, 1e9]")
                : threshold(config, name, "clip_high_threshold", 4.0, 0, 1e9, "[0, 1e9]");
        check_order(lo, hi);
        if (low) out.params[low_key] = ppo ? 1.0 - lo : lo;
        if (high) out.params[high_key] = ppo ? hi - 1.0 : hi;
    } else {
        for (const auto &[given, key] :
             {std::pair{low, "clip_low_threshold"}, std::pair{high, "clip_high_threshold"}})
            if (given)
                throw ApiError(400,
                               std::string("loss_fn_config.") + key + " is not a parameter of " +
                                   name + " (only ppo and cispo clip)",
                               std::string("loss_fn_config.") + key);
    }
    return out;
}

} // namespace rl::serve::tinker
