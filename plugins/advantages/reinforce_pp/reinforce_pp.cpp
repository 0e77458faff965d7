// plugins/advantages/reinforce_pp: REINFORCE++ (Hu et al. 2025), with or
// without a group baseline. See docs/advantages.md.
//
// Per sequence, over its completion tokens c_1..c_k (loss_mask = 1) only:
//   R'     = r - b_g         (group_baseline: true; b_g = group mean reward,
//                             length-weighted with length_weighted_mean)
//          = r               (group_baseline: false)
//   u_t    = token_rewards[t] (0 when absent) + (t == c_k ? R' : 0)
//   G_t    = u_t + gamma * G_{next completion token}   (G after c_k is 0)
//   A_t    = (G_t - mu) / (sigma + eps) with mu, sigma the mean and population
//            std of G over every completion token of the batch (whiten: true)
// Outputs "advantages" = A and "returns" = G (before whitening).
#include <rl/sdk/advantage.hpp>

namespace {

using namespace rl::sdk::advantage;

class ReinforcePP : public rl::sdk::Advantage {
public:
    explicit ReinforcePP(rl::sdk::Params &p)
        : group_baseline_(p.boolean("group_baseline", false)),
          length_weighted_(p.boolean("length_weighted_mean", false)),
          gamma_(p.number("gamma", 1.0, 0.0, 1.0)), whiten_(Whitening::read(p, true)) {
        if (length_weighted_ && !group_baseline_)
            invalid(p.owner() + ": parameter 'length_weighted_mean' needs 'group_baseline': true "
                                "(it weights the group baseline)");
    }

    void compute(Call &call, const AdvantageBatch &b) override {
        check_inputs(b, {"loss_mask", "token_rewards"});
        const std::vector<uint8_t> mask = read_mask(b);
        const std::vector<double> rewards = b.rewards.to_vector();
        const std::vector<double> token_rewards = read_tokens(b, "token_rewards");
        const std::vector<double> lengths = completion_lengths(b.cu_seqlens, mask);

        std::vector<double> seq_r = rewards;
        if (group_baseline_) {
            for (const auto &members : group_members(b.group_ids)) {
                std::vector<double> r, w;
                for (int64_t i : members) {
                    r.push_back(rewards[static_cast<size_t>(i)]);
                    w.push_back(lengths[static_cast<size_t>(i)]);
                }
                if (all_equal(r)) {
                    for (int64_t i : members) seq_r[static_cast<size_t>(i)] = 0.0;
                    continue;
                }
                const double base = length_weighted_ ? weighted_mean(r, w) : mean_of(r);
                for (size_t k = 0; k < members.size(); ++k)
                    seq_r[static_cast<size_t>(members[k])] = r[k] - base;
            }
        }

        const std::vector<double> returns =
            discounted_returns(b.cu_seqlens, mask, seq_r, token_rewards, gamma_);
        emit_returns(call, rewards, whiten_.apply(returns, mask), returns, mask);
    }

private:
    bool group_baseline_;
    bool length_weighted_;
    double gamma_;
    Whitening whiten_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<ReinforcePP>(
    "org.rl.advantage.reinforce_pp", "reinforce_pp", "1.0.0",
    "REINFORCE++: discounted token returns (optional group baseline), whitened over the batch"))
