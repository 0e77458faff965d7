// plugins/advantages/gae: generalized advantage estimation (Schulman et al.
// 2016) over per-token rewards and a critic's values. See docs/advantages.md.
//
// Per sequence, over its completion tokens c_1..c_k (loss_mask = 1) only:
//   u_t     = token_rewards[t] (0 when absent) + (t == c_k ? r : 0)
//   delta_t = u_t + gamma * V_{next completion token} - V_t   (V after c_k is 0)
//   A_t     = delta_t + gamma * lambda * A_{next completion token}
//   R_t     = A_t + V_t
// Outputs "advantages" = A (whitened over the batch's completion tokens when
// whiten: true) and "returns" = R (never whitened).
#include <rl/sdk/advantage.hpp>

namespace {

using namespace rl::sdk::advantage;

class Gae : public rl::sdk::Advantage {
public:
    explicit Gae(rl::sdk::Params &p)
        : gamma_(p.number("gamma", 1.0, 0.0, 1.0)), lambda_(p.number("lambda", 0.95, 0.0, 1.0)),
          whiten_(Whitening::read(p, false)) {}

    void compute(Call &call, const AdvantageBatch &b) override {
        check_inputs(b, {"loss_mask", "token_rewards", "values"}, {"values"});
        const std::vector<uint8_t> mask = read_mask(b);
        const std::vector<double> rewards = b.rewards.to_vector();
        const std::vector<double> token_rewards = read_tokens(b, "token_rewards");
        const std::vector<double> values = read_tokens(b, "values");

        std::vector<double> adv(static_cast<size_t>(b.n_tokens()), 0.0);
        std::vector<double> returns(adv.size(), 0.0);
        for (size_t s = 0; s < rewards.size(); ++s) {
            const std::vector<int64_t> pos = masked_positions(b.cu_seqlens, mask, s);
            double next_value = 0.0, next_adv = 0.0;
            for (size_t j = pos.size(); j-- > 0;) {
                const size_t t = static_cast<size_t>(pos[j]);
                const double u = token_rewards[t] + (j + 1 == pos.size() ? rewards[s] : 0.0);
                const double delta = u + gamma_ * next_value - values[t];
                next_adv = delta + gamma_ * lambda_ * next_adv;
                adv[t] = next_adv;
                returns[t] = next_adv + values[t];
                next_value = values[t];
            }
        }

        emit_returns(call, rewards, whiten_.apply(adv, mask), returns, mask);
        emit_summary(call, rl::sdk::metrics::kValues, values, mask);
    }

private:
    double gamma_;
    double lambda_;
    Whitening whiten_;
};

} // namespace

RL_PLUGIN_DEFINE(rl::sdk::plugin<Gae>("org.rl.advantage.gae", "gae", "1.0.0",
                                      "Generalized advantage estimation over token rewards and "
                                      "values; also returns"))
