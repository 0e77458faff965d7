// plugins/advantages/remax: ReMax (Li et al. 2023; verl `remax`): REINFORCE
// with the reward of the greedy response to the same prompt as the baseline.
// See docs/advantages.md.
//
// The baseline is computed outside (one greedy rollout per prompt) and comes
// in as the per-token input "reward_baselines": each sequence's baseline on
// its completion tokens (the same value on every one of them). Per sequence,
// over its completion tokens c_1..c_k (loss_mask = 1) only:
//   u_t = token_rewards[t] (0 when absent) + (t == c_k ? r : 0)
//   G_t = u_t + G_{next completion token}        (return to go, G after c_k = 0)
//   A_t = G_t - b                                (b = the sequence's baseline)
// Outputs "advantages" = A and "returns" = G. No whitening (as verl).
#include <rl/sdk/advantage.hpp>

namespace {

using namespace rl::sdk::advantage;

class Remax : public rl::sdk::Advantage {
public:
    explicit Remax(rl::sdk::Params &) {}

    void compute(Call &call, const AdvantageBatch &b) override {
        check_inputs(b, {"loss_mask", "reward_baselines", "token_rewards"}, {"reward_baselines"});
        const std::vector<uint8_t> mask = read_mask(b);
        const std::vector<double> rewards = b.rewards.to_vector();
        const std::vector<double> returns =
            discounted_returns(b.cu_seqlens, mask, rewards, read_tokens(b, "token_rewards"), 1.0);
        const std::vector<double> baselines = read_tokens(b, "reward_baselines");
        std::vector<double> adv(returns.size(), 0.0);
        std::vector<double> seq_base;
        for (size_t s = 0; s < rewards.size(); ++s) {
            const std::vector<int64_t> pos = masked_positions(b.cu_seqlens, mask, s);
            if (pos.empty()) continue;
            const double base = baselines[static_cast<size_t>(pos.front())];
            for (int64_t t : pos)
                if (baselines[static_cast<size_t>(t)] != base)
                    invalid("input 'reward_baselines' must hold one value per sequence on its "
                            "completion tokens; sequence " +
                            std::to_string(s) + " has " + std::to_string(base) + " at token " +
                            std::to_string(pos.front()) + " and " +
                            std::to_string(baselines[static_cast<size_t>(t)]) + " at token " +
                            std::to_string(t));
            seq_base.push_back(base);
            for (int64_t t : pos)
                adv[static_cast<size_t>(t)] = returns[static_cast<size_t>(t)] - base;
        }
        emit_returns(call, rewards, adv, returns, mask);
        call.metric("baseline_mean", mean_of(seq_base));
    }
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Remax>("org.rl.advantage.remax", "remax", "1.0.0",
                                        "ReMax: return minus an external (greedy-response) "
                                        "reward baseline; also returns"))
