// sapo: Soft Adaptive Policy Optimization (arXiv 2511.20347; verl "sapo",
// AReaL use_sapo_loss). The hard PPO clip is replaced by a smooth gate of the
// token ratio r_t = exp(logprobs_t - old_logprobs_t):
//   f(r, tau) = (4 / tau) * sigmoid(tau * (r - 1)),   l_t = -f(r_t, tau_t) * A_t
// with tau_t = tau_pos where A_t > 0 and tau_neg elsewhere. f'(1) = 1 for any
// tau, so at r = 1 the gradient is the plain policy gradient -A_t; it decays
// smoothly as r leaves 1 (faster for larger tau). The gradient is
//   d l_t / d logprobs_t = -A_t * 4 * s (1 - s) * r_t,   s = sigmoid(tau_t (r_t - 1)).
#pragma once

#include "../common/loss_common.hpp"

namespace rl::losses {

class Sapo : public LossPlugin {
public:
    explicit Sapo(Params &p) {
        tau_pos_ = p.number("tau_pos", 1.0, 0.0);
        tau_neg_ = p.number("tau_neg", 1.05, 0.0);
        if (tau_pos_ <= 0)
            invalid(p.owner() + ": parameter 'tau_pos' must be > 0, got " + num(tau_pos_));
        if (tau_neg_ <= 0)
            invalid(p.owner() + ": parameter 'tau_neg' must be > 0, got " + num(tau_neg_));
        agg_ = Aggregation::read(p, "seq-mean-token-mean");
        reg_.read(p);
    }

    LossSignature signature() const override {
        LossSignature s{{"logprobs", "old_logprobs", "advantages"}, {"loss_mask"}, {"logprobs"}};
        reg_.add_to(s);
        return s;
    }

    static double sigmoid(double x) {
        if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
        const double e = std::exp(x);
        return e / (1.0 + e);
    }

    Result evaluate(const Data &d, const Data &sg) const override {
        Result r;
        const auto w = agg_.weights(d);
        const auto &lp = d.at("logprobs");
        const auto &lp_sg = sg.at("logprobs");
        const auto &old = d.at("old_logprobs");
        const auto &adv = d.at("advantages");
        auto &g = r.g("logprobs", d.n);
        Stat gate;
        RatioStats rs;
        double pg = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double A = adv[t];
            const double tau = A > 0 ? tau_pos_ : tau_neg_;
            const double ratio = std::exp(lp[t] - old[t]);
            const double s = sigmoid(tau * (ratio - 1.0));
            const double f = 4.0 / tau * s;
            pg += -w[t] * f * A;
            g[t] += -w[t] * A * 4.0 * s * (1.0 - s) * ratio;
            gate.add(f);
            rs.add(lp_sg[t] - old[t], old[t]);
        }
        r.loss = pg;
        r.metric("pg_loss", pg);
        r.metric("gate_mean", gate.mean());
        rs.emit_ratio(r);
        r.metric("valid_tokens", double(d.loss_tokens));
        reg_.apply(d, sg, w, r);
        return r;
    }

private:
    double tau_pos_, tau_neg_;
    Aggregation agg_;
    Regularizers reg_;
};

} // namespace rl::losses
