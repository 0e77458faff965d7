// decoupled_ppo: AReaL's decoupled PPO objective. The PPO clip is taken around
// the proximal policy (prox_logprobs) and the result is weighted by the
// behaviour importance weight exp(prox_logprobs - old_logprobs), which does not
// depend on the current policy. Tokens whose behaviour weight exceeds
// behav_imp_weight_cap are dropped (they still count in the normalizer).
#pragma once

#include "../common/loss_common.hpp"

namespace rl::losses {

class DecoupledPpo : public LossPlugin {
public:
    explicit DecoupledPpo(Params &p) {
        eps_clip_ = p.number("eps_clip", 0.2, 0.0, 1.0);
        if (eps_clip_ >= 1.0)
            invalid(p.owner() +
                    ": parameter 'eps_clip' must be < 1 (the lower bound is 1 - eps_clip)");
        eps_clip_higher_ = p.optional_number("eps_clip_higher", 0.0).value_or(eps_clip_);
        c_clip_ = p.optional_number("c_clip", 1.0);
        if (c_clip_ && *c_clip_ <= 1.0)
            invalid(p.owner() + ": parameter 'c_clip' must be > 1 (or null for off), got " +
                    num(*c_clip_));
        behav_cap_ = p.optional_number("behav_imp_weight_cap", 0.0);
        if (behav_cap_ && *behav_cap_ <= 0.0)
            invalid(p.owner() + ": parameter 'behav_imp_weight_cap' must be > 0 (or null for off)");
        agg_ = Aggregation::read(p);
        reg_.read(p);
    }

    LossSignature signature() const override {
        LossSignature s{{"logprobs", "old_logprobs", "prox_logprobs", "advantages"},
                        {"loss_mask"},
                        {"logprobs"}};
        reg_.add_to(s);
        return s;
    }

    Result evaluate(const Data &d, const Data &sg) const override {
        Result r;
        const auto w = agg_.weights(d);
        const auto &lp = d.at("logprobs");
        const auto &old = d.at("old_logprobs");
        const auto &prox = d.at("prox_logprobs");
        const auto &adv = d.at("advantages");
        auto &g = r.g("logprobs", d.n);
        const double lo = 1.0 - eps_clip_, hi = 1.0 + eps_clip_higher_;
        int64_t clipped = 0, dual_clipped = 0, behav_masked = 0;
        Stat ratio_s, approx_kl, behav_w, behav_kl;
        double pg = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double A = adv[t];
            const double ratio = std::exp(lp[t] - prox[t]);
            ratio_s.add(ratio);
            approx_kl.add(lp[t] - prox[t]);
            const double l1 = -A * ratio, l2 = -A * std::clamp(ratio, lo, hi);
            double l = l1, dl = -A * ratio;
            if (l2 > l1) {
                l = l2;
                dl = 0;
                ++clipped;
            }
            if (c_clip_ && A < 0 && -A * *c_clip_ < l) {
                l = -A * *c_clip_;
                dl = 0;
                ++dual_clipped;
            }
            const double bw = std::exp(prox[t] - old[t]);
            if (behav_cap_ && bw > *behav_cap_) {
                ++behav_masked;
                continue;
            }
            behav_w.add(bw);
            behav_kl.add(prox[t] - old[t]);
            pg += w[t] * bw * l;
            g[t] += w[t] * bw * dl;
        }
        r.loss = pg;
        r.metric("pg_loss", pg);
        r.metric("pg_clipfrac", frac(clipped, d.loss_tokens));
        if (c_clip_) r.metric("dual_clipfrac", frac(dual_clipped, d.loss_tokens));
        r.metric("ratio_mean", ratio_s.mean(1.0));
        r.metric("approx_kl", approx_kl.mean());
        r.metric("behav_imp_weight", behav_w.mean(1.0));
        r.metric("behav_approx_kl", behav_kl.mean());
        if (behav_cap_) r.metric("behav_maskfrac", frac(behav_masked, d.loss_tokens));
        r.metric("valid_tokens", double(d.loss_tokens));
        reg_.apply(d, sg, w, r);
        return r;
    }

private:
    double eps_clip_, eps_clip_higher_;
    std::optional<double> c_clip_, behav_cap_;
    Aggregation agg_;
    Regularizers reg_;
};

} // namespace rl::losses
