// A complete loss plugin: REINFORCE with a baseline-free advantage,
// loss = -mean over loss tokens of (advantage * logprob).
#include <rl/sdk/sdk.hpp>

class MyLoss : public rl::sdk::Loss {
public:
    explicit MyLoss(rl::sdk::Params &p) : scale_(p.number("scale", 1.0, 0.0, 1e6)) {}

    rl::sdk::LossSignature signature() const override {
        return {{"logprobs", "advantages"}, {"loss_mask"}, {"logprobs"}};
    }

    double compute(rl::sdk::Call &call, const rl::sdk::LossBatch &b, rl::sdk::Grads &g) override {
        const auto &lp = b.inputs.get("logprobs");
        const auto &adv = b.inputs.get("advantages");
        const auto *mask = b.inputs.find("loss_mask");
        double tokens = 0, sum = 0;
        for (int64_t i = 0; i < b.n_tokens; ++i) tokens += mask ? (*mask)[i] : 1.0;
        const double denom = b.global_tokens > 0 ? b.global_tokens : std::max(tokens, 1.0);
        const rl::sdk::TensorOut *grad = g.find("logprobs");
        for (int64_t i = 0; i < b.n_tokens; ++i) {
            const double m = mask ? (*mask)[i] : 1.0;
            sum += m * adv[i] * lp[i];
            if (grad) grad->set(i, -scale_ * m * adv[i] / denom);
        }
        call.metric("tokens", tokens);
        return -scale_ * sum / denom;
    }

private:
    double scale_;
};

RL_PLUGIN_DEFINE(rl::sdk::plugin<MyLoss>("org.example.loss.my_loss", "my_loss", "0.1.0",
                                         "REINFORCE: -mean(advantage * logprob)"))
