// kl_cov: KL-Cov (Cui et al. 2025; verl "kl_cov"). The unclipped
// importance-sampling loss -A_t r_t on every loss token, plus
// ppo_kl_coef * |logprobs_t - old_logprobs_t| on the k = max(floor(kl_cov_ratio
// * T), 1) loss tokens with the largest covariance term cov_t
// (rl/sdk/pg_loss.hpp; T = the call's loss tokens; ties to the lower token
// index, so the selection is deterministic).
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class KlCov : public PolicyGradientLoss {
public:
    explicit KlCov(Params &p) {
        ratio_ = p.number("kl_cov_ratio", 2e-4, 0.0, 1.0);
        check_positive(p, "kl_cov_ratio", ratio_);
        coef_ = p.number("ppo_kl_coef", 0.1, 0.0);
        read_shared(p);
    }

    void policy(PgCall &c) const override {
        const auto cov = token_covariance(c.sg);
        const auto chosen = select_top(c.tokens(), cov, selection_count(ratio_, c.d.loss_tokens));
        std::vector<uint8_t> pen(static_cast<size_t>(c.d.n), 0);
        for (int64_t t : chosen) pen[t] = 1;

        Stat abs_kl;
        for (int64_t t : c.tokens()) {
            const double A = c.adv[t], lr = c.log_ratio(t);
            const double ratio = std::exp(lr);
            double l = -A * ratio, dl = -A * ratio;
            if (pen[t]) {
                l += coef_ * std::fabs(lr);
                dl += coef_ * (lr > 0 ? 1.0 : lr < 0 ? -1.0 : 0.0);
            }
            c.add(t, l, dl);
            c.put("kl_cov_mask", t, pen[t]);
            abs_kl.add(std::fabs(lr));
        }
        c.token_frac(metrics::kKlCovFrac, int64_t(chosen.size()));
        abs_kl.emit_mean(c.r, metrics::kAbsKl);
    }

private:
    double ratio_, coef_;
};

} // namespace rl::losses
