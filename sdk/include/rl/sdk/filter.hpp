// rl/sdk/filter.hpp: the rollout-filter toolkit (header-only, C++17, ABI +
// SDK only): the input checks every filter makes, and its verdict. Text and
// randomness helpers are in rl/sdk/utf8_rng.hpp.
#pragma once

#include "sdk.hpp"

#include <cmath>
#include <string>

namespace rl::sdk::filter {

// Log-probabilities may round slightly above 0; anything beyond this is not a
// log-probability (logits or probabilities passed by mistake).
inline constexpr double kLogprobSlack = 1e-4;

// Token ids must lie in [0, vocab_size); logprobs must be finite and <= 0.
// The SDK has already checked that both have the same length and that
// vocab_size > 0.
inline void validate_rollout(const rl::sdk::Rollout &r) {
    if (r.token_ids.is_float()) rl::sdk::invalid("rollout 'token_ids' must be an integer tensor");
    for (int64_t t = 0; t < r.token_ids.size(); ++t) {
        const int64_t id = r.token_ids.as_int(t);
        if (id < 0 || id >= r.vocab_size)
            rl::sdk::invalid("rollout 'token_ids' holds " + std::to_string(id) + " at position " +
                             std::to_string(t) + ", outside the vocabulary [0, " +
                             std::to_string(r.vocab_size) + ")");
        const double lp = r.logprobs[t];
        if (!std::isfinite(lp))
            rl::sdk::fail(RL_ERR_NUMERIC, std::string("rollout 'logprobs' has ") +
                                              (std::isnan(lp) ? "NaN" : "Inf") + " at position " +
                                              std::to_string(t));
        if (lp > kLogprobSlack)
            rl::sdk::invalid("rollout 'logprobs' holds " + std::to_string(lp) + " at position " +
                             std::to_string(t) + "; log-probabilities are <= 0");
    }
}

// The verdict of a filter: flagged with `reason` when `flagged`, passed (no
// reason) otherwise.
inline rl::sdk::Verdict flag_if(bool flagged, const char *reason) {
    rl::sdk::Verdict v;
    v.flagged = flagged;
    if (flagged) v.reason = reason;
    return v;
}

} // namespace rl::sdk::filter
