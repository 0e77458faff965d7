// plugins/filters/repetition: flags a rollout stuck in a loop of near-certain
// tokens. See docs/filters.md.
//
// A token is "near-certain" when exp(logprobs[t]) > prob_threshold (strict).
// The rollout is flagged (reason "repetition") when it contains a run of at
// least `window` consecutive near-certain tokens; any other token ends a run.
// Whether a flagged rollout is masked (`enforce`) is the host's decision.
#include <rl/sdk/filter.hpp>

#include <algorithm>
#include <cmath>

namespace {

class Repetition : public rl::sdk::Filter {
public:
    explicit Repetition(rl::sdk::Params &p)
        : window_(p.integer("window", 3000, 1)),
          threshold_(p.number("prob_threshold", 0.99, 0.0, 1.0)) {
        if (threshold_ >= 1.0)
            rl::sdk::invalid(p.owner() + ": parameter 'prob_threshold' must be below 1 (no "
                                         "probability exceeds 1), got 1");
    }

    rl::sdk::Verdict check(rl::sdk::Call &call, const rl::sdk::Rollout &r) override {
        rl::sdk::filter::validate_rollout(r);
        int64_t run = 0, longest = 0, high = 0;
        for (int64_t t = 0; t < r.logprobs.size(); ++t) {
            if (std::exp(r.logprobs[t]) > threshold_) {
                ++high;
                longest = std::max(longest, ++run);
            } else {
                run = 0;
            }
        }
        call.metric("repetition_longest_run", static_cast<double>(longest));
        call.metric("repetition_high_prob_tokens", static_cast<double>(high));
        return rl::sdk::filter::flag_if(longest >= window_, "repetition");
    }

private:
    int64_t window_;
    double threshold_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Repetition>(
    "org.rl.filter.repetition", "repetition", "1.0.0",
    "Flags rollouts with `window` consecutive tokens of probability > prob_threshold"))
