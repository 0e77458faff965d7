// A complete loss plugin on the SDK's policy-gradient toolkit (rl/sdk/loss.hpp):
// REINFORCE, l_t = -scale * advantage_t * logprob_t. The toolkit adds every
// loss_agg_mode, the kl_coef / entropy_coef terms and the input checks.
#include <rl/sdk/loss.hpp>

using namespace rl::sdk::loss;

class MyLoss : public TokenLoss {
public:
    explicit MyLoss(Params &p)
        : TokenLoss(p, {"advantages"}), scale_(p.number("scale", 1.0, 0.0)) {}

    Term token(const Data &d, const Data &, int64_t t) const override {
        const double a = d.at("advantages")[t];
        return {-scale_ * a * d.at("logprobs")[t], -scale_ * a};
    }

private:
    double scale_;
};

RL_PLUGIN_DEFINE(rl::sdk::plugin<MyLoss>("org.example.loss.my_loss", "my_loss", "0.1.0",
                                         "REINFORCE: -advantage * logprob, any loss_agg_mode"))
