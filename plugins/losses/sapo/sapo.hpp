// sapo: Soft Adaptive Policy Optimization (arXiv 2511.20347; verl "sapo",
// AReaL use_sapo_loss). The hard PPO clip is replaced by a smooth gate of the
// token ratio r_t = exp(logprobs_t - old_logprobs_t):
//   f(r, tau) = (4 / tau) * sigmoid(tau * (r - 1)),   l_t = -f(r_t, tau_t) * A_t
// with tau_t = tau_pos where A_t > 0 and tau_neg elsewhere. f'(1) = 1 for any
// tau, so at r = 1 the gradient is the plain policy gradient -A_t; it decays
// smoothly as r leaves 1 (faster for larger tau). The gradient is
//   d l_t / d logprobs_t = -A_t * 4 * s (1 - s) * r_t,   s = sigmoid(tau_t (r_t - 1)).
//
// importance_sampling_level "sequence" (AReaL's sapo_loss_fn at that level): per
// sequence i over its n_i loss tokens, s_i = exp(mean(logprobs - old_logprobs)) and
// Abar_i = mean(A); every loss token of i gets l_t = -f(s_i, tau_i) * Abar_i with
// tau_i chosen by the sign of Abar_i. d s_i / d logprobs_u = s_i / n_i for every
// loss token u of i, so
//   d L / d logprobs_u = (sum over loss tokens t of i of w_t) * -Abar_i * 4 s (1 - s) * s_i / n_i.
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
        sequence_ =
            p.choice("importance_sampling_level", "token", {"token", "sequence"}) == "sequence";
        read_shared(p, "seq-mean-token-mean");
    }

    static double sigmoid(double x) {
        if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
        const double e = std::exp(x);
        return e / (1.0 + e);
    }

    void policy(PgCall &c) const override {
        if (sequence_) {
            policy_sequence(c);
            return;
        }
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
    // One gate per sequence: the geometric-mean ratio s_i and the mean advantage
    // over the sequence's loss tokens, broadcast to each of them.
    void policy_sequence(PgCall &c) const {
        const Data &d = c.d;
        Stat gate, ratio;
        for (int64_t s = 0; s < d.n_seqs(); ++s) {
            const int64_t ni = d.seq_tokens[s];
            if (ni == 0) continue;
            double sum_a = 0, sum_w = 0;
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
                if (d.mask[t] != 0) {
                    sum_a += c.adv[t];
                    sum_w += c.w[t];
                }
            const double abar = sum_a / double(ni);
            const double tau = abar > 0 ? tau_pos_ : tau_neg_;
            const double si = seq_geo_ratio(d, c.lp, c.old, s);
            const double si_sg = seq_geo_ratio(d, c.lp_sg, c.old, s);
            const double sig = sigmoid(tau * (si - 1.0));
            const double f = 4.0 / tau * sig;
            const double f_sg = 4.0 / tau * sigmoid(tau * (si_sg - 1.0));
            c.pg += -sum_w * f * abar;
            const double per_token = -sum_w * abar * 4.0 * sig * (1.0 - sig) * si / double(ni);
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t) {
                if (d.mask[t] == 0) continue;
                c.g[t] += per_token;
                gate.add(f_sg);
                ratio.add(si_sg);
                c.put("elementwise_loss", t, -f * abar);
                c.put("gate", t, f);
                c.put("ratio", t, si);
            }
        }
        gate.emit_mean(c.r, metrics::kGateMean);
        ratio.emit_mean(c.r, metrics::kRatioMean, 1.0);
        ratio.emit_min(c.r, metrics::kRatioMin, 1.0);
        ratio.emit_max(c.r, metrics::kRatioMax, 1.0);
    }

    double tau_pos_, tau_neg_;
    bool sequence_ = false;
};

} // namespace rl::losses
