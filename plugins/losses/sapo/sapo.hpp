// sapo: Soft Adaptive Policy Optimization (arXiv 2511.20347; verl "sapo",
// AReaL use_sapo_loss). The hard PPO clip is replaced by a smooth gate of the
// token ratio r_t = exp(logprobs_t - old_logprobs_t):
//   f(r, tau) = (4 / tau) * sigmoid(tau * (r - 1)),   l_t = -f(r_t, tau_t) * A_t
// with tau_t = tau_pos where A_t > 0 and tau_neg elsewhere. f'(1) = 1 for any
// tau, so at r = 1 the gradient is the plain policy gradient -A_t; it decays
// smoothly as r leaves 1 (faster for larger tau). The gradient is
//   d l_t / d logprobs_t = -A_t * 4 * s (1 - s) * r_t,   s = sigmoid(tau_t (r_t - 1)).
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class Sapo : public PolicyGradientLoss {
public:
    explicit Sapo(Params &p) {
        tau_pos_ = p.number("tau_pos", 1.0, 0.0);
        tau_neg_ = p.number("tau_neg", 1.05, 0.0);
        check_positive(p, "tau_pos", tau_pos_);
        check_positive(p, "tau_neg", tau_neg_);
        read_shared(p, "seq-mean-token-mean");
    }

    static double sigmoid(double x) {
        if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
        const double e = std::exp(x);
        return e / (1.0 + e);
    }

    void policy(PgCall &c) const override {
        Stat gate;
        RatioStats rs;
        for (int64_t t : c.tokens()) {
            const double A = c.adv[t];
            const double tau = A > 0 ? tau_pos_ : tau_neg_;
            const double ratio = c.ratio(t);
            const double s = sigmoid(tau * (ratio - 1.0));
            const double f = 4.0 / tau * s;
            c.pg += -c.w[t] * f * A;
            c.g[t] += -c.w[t] * A * 4.0 * s * (1.0 - s) * ratio;
            gate.add(f);
            c.put("elementwise_loss", t, -f * A);
            c.put("gate", t, f);
            rs.add(c.log_ratio_sg(t), c.old[t]);
        }
        gate.emit_mean(c.r, metrics::kGateMean);
        rs.emit_ratio(c.r);
    }

private:
    double tau_pos_, tau_neg_;
};

} // namespace rl::losses
