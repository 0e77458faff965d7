// clip_cov: Clip-Cov (Cui et al. 2025; verl "clip_cov"). PPO's clipped
// surrogate, except that k = max(floor(clip_cov_ratio * T), 1) tokens (T = the
// call's loss tokens) are dropped from the loss and its gradient. They are
// drawn from the candidates: loss tokens that PPO did not clip and whose
// covariance term cov_t (rl/sdk/pg_loss.hpp) lies strictly between
// clip_cov_lb and clip_cov_ub. Dropped tokens still count in the normalizer.
//
// selection "random" (default, as the paper and verl): a uniform draw without
// replacement, seeded by `seed` and the call's detached inputs (the same call
// drops the same tokens). selection "top": the k largest cov_t, ties to the
// lower token index.
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class ClipCov : public PolicyGradientLoss {
public:
    explicit ClipCov(Params &p) {
        clip_ = read_clip_bounds(p, 0.2, 0.2);
        ratio_ = p.number("clip_cov_ratio", 2e-4, 0.0, 1.0);
        check_positive(p, "clip_cov_ratio", ratio_);
        lb_ = p.number("clip_cov_lb", 1.0);
        ub_ = p.number("clip_cov_ub", 5.0);
        check_order(p, "clip_cov_lb", lb_, "clip_cov_ub", ub_);
        random_ = p.choice("selection", "random", {"random", "top"}) == "random";
        if (!random_ && p.has("seed"))
            invalid(p.owner() + ": parameter 'seed' only applies to selection 'random'");
        seed_ = p.integer("seed", 0, 0);
        read_shared(p);
    }

    void policy(PgCall &c) const override {
        const double lo = clip_.lo, hi = clip_.hi;

        // The selection, from the detached view.
        const auto cov = token_covariance(c.sg);
        std::vector<int64_t> candidates;
        for (int64_t t : c.tokens()) {
            const bool ppo_clipped = ppo_clip(c.adv[t], c.ratio_sg(t), lo, hi).clipped;
            if (!ppo_clipped && cov[t] > lb_ && cov[t] < ub_) candidates.push_back(t);
        }
        const int64_t k = selection_count(ratio_, c.d.loss_tokens);
        const auto chosen =
            random_ ? select_random(candidates, c.sg, seed_, k) : select_top(candidates, cov, k);
        std::vector<uint8_t> drop(static_cast<size_t>(c.d.n), 0);
        for (int64_t t : chosen) drop[t] = 1;

        int64_t clipped = 0;
        for (int64_t t : c.tokens()) {
            const double A = c.adv[t], ratio = c.ratio(t);
            const PpoTerm ppo = ppo_clip(A, ratio, lo, hi);
            if (ppo.clipped) ++clipped;
            c.put("clip_mask", t, ppo.clipped);
            c.put("cov_mask", t, drop[t]);
            c.put("elementwise_loss", t, drop[t] ? 0.0 : ppo.loss);
            if (drop[t]) continue;
            c.pg += c.w[t] * ppo.loss;
            if (!ppo.clipped) c.g[t] += -c.w[t] * A * ratio;
        }
        c.token_frac(metrics::kPgClipfrac, clipped);
        c.token_frac(metrics::kCovClipfrac, int64_t(chosen.size()));
        c.r.sum(metrics::kCovCandidates, double(candidates.size()));
    }

private:
    ClipBounds clip_;
    double ratio_, lb_, ub_;
    bool random_;
    int64_t seed_;
};

} // namespace rl::losses
