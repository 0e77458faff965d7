// A complete loss plugin on the SDK's policy-gradient base (rl/sdk/pg_loss.hpp):
// REINFORCE with the importance ratio, l_t = -scale * exp(logprobs - old) * A_t.
// The base adds every loss_agg_mode, kl_coef / kl_type, entropy_coef, the
// input checks, pg_loss / valid_tokens / ref_kl / entropy metrics and gradients.
#include <rl/sdk/pg_loss.hpp>

using namespace rl::sdk::loss;

class MyLoss : public PolicyGradientLoss {
public:
    explicit MyLoss(rl::sdk::Params &p) : scale_(p.number("scale", 1.0, 0.0, 1e6)) {
        read_shared(p); // loss_agg_mode, max_seq_len, kl_coef, kl_type, entropy_coef
    }

    // Per loss token: the weighted value and its gradient w.r.t. logprobs.
    void policy(PgCall &c) const override {
        for (int64_t t : c.tokens()) {
            const double l = -scale_ * c.ratio(t) * c.adv[t];
            c.add(t, l, l); // d l / d logprobs = l, since d ratio / d logprobs = ratio
        }
    }

private:
    double scale_;
};

RL_PLUGIN_DEFINE(rl::sdk::plugin<MyLoss>("org.example.loss.my_loss", "my_loss", "0.1.0",
                                         "-scale * ratio * advantage, every loss_agg_mode"))
