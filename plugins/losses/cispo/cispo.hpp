// cispo: CISPO (MiniMax-M1) as xorl / Tinker define it: the importance ratio,
// clipped to [clip_low, clip_high] and detached, weights the plain policy
// gradient: l_t = -sg(clip(ratio_t)) * A_t * logprobs_t. Every loss token keeps
// a gradient; clipping only bounds its weight.
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class Cispo : public PolicyGradientLoss {
public:
    explicit Cispo(Params &p) {
        // Peers' epsilon-style bounds (1 - eps, 1 + eps) have absolute bounds here.
        for (const char *k : {"eps_clip", "clip_ratio_low", "clip_eps_low", "epsilon"})
            p.refuse(k, "cispo's bounds are absolute ratios: use 'clip_low' = 1 - " +
                            std::string(k) + " (default 0: no lower bound)");
        for (const char *k : {"eps_clip_high", "clip_ratio_high", "clip_eps_high", "epsilon_high"})
            p.refuse(k, "cispo's bounds are absolute ratios: use 'clip_high' = 1 + " +
                            std::string(k) + " (default 4)");
        clip_low_ = p.number("clip_low", 0.0, 0.0);
        clip_high_ = p.number("clip_high", 4.0, 0.0);
        check_order(p, "clip_low", clip_low_, "clip_high", clip_high_);
        compute_kl_stats_ = p.boolean("compute_kl_stats", false);
        read_shared(p);
    }

    void policy(PgCall &c) const override {
        RatioStats rs;
        int64_t clipped = 0;
        for (int64_t t : c.tokens()) {
            const double ratio = c.ratio_sg(t);
            const double cr = std::clamp(ratio, clip_low_, clip_high_);
            if (cr != ratio) ++clipped;
            rs.add(c.log_ratio_sg(t), c.old[t]);
            c.pg += -c.w[t] * cr * c.adv[t] * c.lp[t];
            c.g[t] += -c.w[t] * cr * c.adv[t];
            c.put("elementwise_loss", t, -cr * c.adv[t] * c.lp[t]);
            c.put("is_weights", t, cr);
            c.put("clip_mask", t, cr != ratio);
        }
        rs.emit_ratio(c.r);
        c.token_frac(metrics::kClipFraction, clipped);
        if (compute_kl_stats_) rs.emit_kl(c.r);
    }

private:
    double clip_low_, clip_high_;
    bool compute_kl_stats_;
};

} // namespace rl::losses
