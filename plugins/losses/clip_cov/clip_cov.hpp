// clip_cov: Clip-Cov (Cui et al. 2025; verl "clip_cov"). PPO's clipped
// surrogate, except that k = max(floor(clip_cov_ratio * T), 1) tokens (T = the
// call's loss tokens) are dropped from the loss and its gradient. They are
// drawn from the candidates: loss tokens that PPO did not clip and whose
// covariance term cov_t (common/covariance.hpp) lies strictly between
// clip_cov_lb and clip_cov_ub. Dropped tokens still count in the normalizer.
//
// selection "random" (default, as the paper and verl): a uniform draw without
// replacement, seeded by `seed` and the call's detached inputs (the same call
// drops the same tokens). selection "top": the k largest cov_t, ties to the
// lower token index.
#pragma once

#include "../common/covariance.hpp"

namespace rl::losses {

class ClipCov : public LossPlugin {
public:
    explicit ClipCov(Params &p) {
        eps_clip_ = p.number("eps_clip", 0.2, 0.0, 1.0);
        if (eps_clip_ >= 1.0)
            invalid(p.owner() +
                    ": parameter 'eps_clip' must be < 1 (the lower bound is 1 - eps_clip)");
        eps_clip_high_ = p.number("eps_clip_high", 0.2, 0.0);
        ratio_ = p.number("clip_cov_ratio", 2e-4, 0.0, 1.0);
        if (ratio_ <= 0)
            invalid(p.owner() + ": parameter 'clip_cov_ratio' must be > 0, got " + num(ratio_));
        lb_ = p.number("clip_cov_lb", 1.0);
        ub_ = p.number("clip_cov_ub", 5.0);
        if (ub_ < lb_)
            invalid(p.owner() + ": parameter 'clip_cov_ub' (" + num(ub_) +
                    ") must be >= 'clip_cov_lb' (" + num(lb_) + ")");
        random_ = p.choice("selection", "random", {"random", "top"}) == "random";
        if (!random_ && p.has("seed"))
            invalid(p.owner() + ": parameter 'seed' only applies to selection 'random'");
        seed_ = p.integer("seed", 0, 0);
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
        const auto &lp_sg = sg.at("logprobs");
        const auto &old = d.at("old_logprobs");
        const auto &adv = d.at("advantages");
        auto &g = r.g("logprobs", d.n);
        const double lo = 1.0 - eps_clip_, hi = 1.0 + eps_clip_high_;

        // The selection, from the detached view.
        const auto cov = token_covariance(sg);
        std::vector<int64_t> candidates;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double ratio = std::exp(lp_sg[t] - old[t]);
            const bool ppo_clipped = -adv[t] * std::clamp(ratio, lo, hi) > -adv[t] * ratio;
            if (!ppo_clipped && cov[t] > lb_ && cov[t] < ub_) candidates.push_back(t);
        }
        const int64_t k = selection_count(ratio_, d.loss_tokens);
        const auto chosen =
            random_ ? select_random(candidates, sg, seed_, k) : select_top(candidates, cov, k);
        std::vector<uint8_t> drop(static_cast<size_t>(d.n), 0);
        for (int64_t t : chosen) drop[t] = 1;

        int64_t clipped = 0;
        double pg = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double A = adv[t];
            const double ratio = std::exp(lp[t] - old[t]);
            const double l1 = -A * ratio, l2 = -A * std::clamp(ratio, lo, hi);
            if (l2 > l1) ++clipped;
            if (drop[t]) continue;
            if (l2 > l1) {
                pg += w[t] * l2;
            } else {
                pg += w[t] * l1;
                g[t] += -w[t] * A * ratio;
            }
        }
        r.loss = pg;
        r.metric("pg_loss", pg);
        r.metric("pg_clipfrac", frac(clipped, d.loss_tokens));
        r.metric("cov_clipfrac", frac(int64_t(chosen.size()), d.loss_tokens));
        r.metric("cov_candidates", double(candidates.size()));
        r.metric("valid_tokens", double(d.loss_tokens));
        reg_.apply(d, sg, w, r);
        return r;
    }

private:
    double eps_clip_, eps_clip_high_, ratio_, lb_, ub_;
    bool random_;
    int64_t seed_;
    Aggregation agg_;
    Regularizers reg_;
};

} // namespace rl::losses
