// kl_cov: KL-Cov (Cui et al. 2025; verl "kl_cov"). The unclipped
// importance-sampling loss -A_t r_t on every loss token, plus
// ppo_kl_coef * |logprobs_t - old_logprobs_t| on the k = max(floor(kl_cov_ratio
// * T), 1) loss tokens with the largest covariance term cov_t
// (common/covariance.hpp; T = the call's loss tokens; ties to the lower token
// index, so the selection is deterministic).
#pragma once

#include "../common/covariance.hpp"

namespace rl::losses {

class KlCov : public LossPlugin {
public:
    explicit KlCov(Params &p) {
        ratio_ = p.number("kl_cov_ratio", 2e-4, 0.0, 1.0);
        if (ratio_ <= 0)
            invalid(p.owner() + ": parameter 'kl_cov_ratio' must be > 0, got " + num(ratio_));
        coef_ = p.number("ppo_kl_coef", 0.1, 0.0);
        agg_ = Aggregation::read(p);
        reg_.read(p);
    }

    LossSignature signature() const override {
        LossSignature s{{"logprobs", "old_logprobs", "advantages"}, {"loss_mask"}, {"logprobs"}};
        reg_.add_to(s);
        return s;
    }

    Result evaluate(const Data &d, const Data &sg) const override {
        Result r;
        const auto w = agg_.weights(d);
        const auto &lp = d.at("logprobs");
        const auto &old = d.at("old_logprobs");
        const auto &adv = d.at("advantages");
        auto &g = r.g("logprobs", d.n);

        const auto cov = token_covariance(sg);
        std::vector<int64_t> all;
        for (int64_t t = 0; t < d.n; ++t)
            if (d.mask[t] != 0) all.push_back(t);
        const auto chosen = select_top(all, cov, selection_count(ratio_, d.loss_tokens));
        std::vector<uint8_t> pen(static_cast<size_t>(d.n), 0);
        for (int64_t t : chosen) pen[t] = 1;

        Stat abs_kl;
        double pg = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double A = adv[t], lr = lp[t] - old[t];
            const double ratio = std::exp(lr);
            double l = -A * ratio, dl = -A * ratio;
            if (pen[t]) {
                l += coef_ * std::fabs(lr);
                dl += coef_ * (lr > 0 ? 1.0 : lr < 0 ? -1.0 : 0.0);
            }
            pg += w[t] * l;
            g[t] += w[t] * dl;
            abs_kl.add(std::fabs(lr));
        }
        r.loss = pg;
        r.metric("pg_loss", pg);
        r.metric("kl_cov_frac", frac(int64_t(chosen.size()), d.loss_tokens));
        r.metric("abs_kl", abs_kl.mean());
        r.metric("valid_tokens", double(d.loss_tokens));
        reg_.apply(d, sg, w, r);
        return r;
    }

private:
    double ratio_, coef_;
    Aggregation agg_;
    Regularizers reg_;
};

} // namespace rl::losses
