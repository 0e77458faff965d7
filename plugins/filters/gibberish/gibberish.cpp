// plugins/filters/gibberish: flags a rollout that sampled a rare, high-id token
// far below the uniform-distribution log-probability. See docs/filters.md.
//
// A token t trips the filter when BOTH hold (strict inequalities):
//   token_ids[t] > token_id_threshold
//   logprobs[t]  < -ln(vocab_size) - logprob_offset
// The rollout is flagged (reason "gibberish") when at least one token trips.
// Whether a flagged rollout is masked (`enforce`) is the host's decision.
#include <rl/sdk/filter.hpp>

#include <cmath>

namespace {

class Gibberish : public rl::sdk::Filter {
public:
    explicit Gibberish(rl::sdk::Params &p)
        : threshold_(p.integer("token_id_threshold", 100000, 0)),
          offset_(p.number("logprob_offset", 2.0, 0.0)) {}

    rl::sdk::Verdict check(rl::sdk::Call &call, const rl::sdk::Rollout &r) override {
        rl::sdk::filter::validate_rollout(r);
        const double cutoff = -std::log(static_cast<double>(r.vocab_size)) - offset_;
        int64_t count = 0, first = -1;
        for (int64_t t = 0; t < r.token_ids.size(); ++t) {
            if (r.token_ids.as_int(t) > threshold_ && r.logprobs[t] < cutoff) {
                if (first < 0) first = t;
                ++count;
            }
        }
        call.metric("gibberish_tokens", static_cast<double>(count));
        call.metric("gibberish_first_position", static_cast<double>(first));
        return rl::sdk::filter::flag_if(count > 0, "gibberish");
    }

private:
    int64_t threshold_;
    double offset_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Gibberish>(
    "org.rl.filter.gibberish", "gibberish", "1.0.0",
    "Flags rollouts that sampled a token with id > token_id_threshold and logprob < "
    "-ln(V) - logprob_offset"))
