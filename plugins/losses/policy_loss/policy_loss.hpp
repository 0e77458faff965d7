// policy_loss: PPO's clipped surrogate with xorl's options (asymmetric clip,
// dual clip, IcePop, TIS), the shared KL / entropy terms and every
// loss_agg_mode. Formulas and metrics: docs/losses.md.
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class PolicyLoss : public PolicyGradientLoss {
public:
    explicit PolicyLoss(Params &p) {
        clip_ = read_clip_bounds(p, 0.2, 0.2, "eps_clip_c");
        eps_clip_c_ = read_optional_above_one(p, "eps_clip_c");
        icepop_beta_ = read_optional_above_one(p, "icepop_beta");
        use_tis_ = p.boolean("use_tis", false);
        tis_clip_low_ = p.number("tis_clip_low", 0.1, 0.0);
        tis_clip_high_ = p.number("tis_clip_high", 2.0, 0.0);
        check_order(p, "tis_clip_low", tis_clip_low_, "tis_clip_high", tis_clip_high_);
        compute_kl_stats_ = p.boolean("compute_kl_stats", false);
        read_shared(p);
    }

    void add_inputs(LossSignature &s) const override {
        if (use_tis_) s.required.push_back("rollout_logprobs");
    }

    void policy(PgCall &c) const override {
        const auto *roll = use_tis_ ? &c.d.at("rollout_logprobs") : nullptr;
        int64_t clipped = 0, icepop_masked = 0, tis_clipped = 0;
        Stat tis;
        RatioStats rs;
        for (int64_t t : c.tokens()) {
            // PPO with dual clip (A < 0); a clipped branch has no gradient.
            const PpoTerm ppo = ppo_clip(c.adv[t], c.ratio(t), clip_.lo, clip_.hi, eps_clip_c_);
            if (ppo.clipped || ppo.dual_clipped) ++clipped;
            // Detached quantities come from the stop-gradient view.
            const double ratio_sg = c.ratio_sg(t);
            rs.add(c.log_ratio_sg(t), c.old[t]);
            double keep = 1.0;
            if (icepop_beta_ && (ratio_sg < 1.0 / *icepop_beta_ || ratio_sg > *icepop_beta_)) {
                keep = 0.0;
                ++icepop_masked;
            }
            double tis_w = 1.0;
            if (roll) {
                const double raw = std::exp(c.lp_sg[t] - (*roll)[t]);
                tis_w = std::clamp(raw, tis_clip_low_, tis_clip_high_);
                if (tis_w != raw) ++tis_clipped;
                tis.add(raw);
            }
            if (keep != 0) {
                c.pg += c.w[t] * tis_w * ppo.loss;
                c.g[t] += c.w[t] * tis_w * ppo.dloss;
            }
            c.put("elementwise_loss", t, keep * tis_w * ppo.loss);
            c.put("ratio", t, ratio_sg);
            c.put("clip_mask", t, ppo.clipped || ppo.dual_clipped);
            if (eps_clip_c_) c.put("dual_clip_mask", t, ppo.dual_clipped);
            if (icepop_beta_) c.put("icepop_mask", t, 1.0 - keep);
            if (roll) c.put("tis_weights", t, tis_w);
        }
        c.token_frac(metrics::kPgClipfrac, clipped);
        if (icepop_beta_) c.token_frac(metrics::kIcepopMaskfrac, icepop_masked);
        if (use_tis_) {
            tis.emit_mean(c.r, metrics::kTisMean, 1.0);
            tis.emit_min(c.r, metrics::kTisMin, 1.0);
            tis.emit_max(c.r, metrics::kTisMax, 1.0);
            c.token_frac(metrics::kTisClipfrac, tis_clipped);
        }
        if (compute_kl_stats_) {
            rs.emit_kl(c.r);
            rs.emit_ratio(c.r);
        }
    }

private:
    ClipBounds clip_;
    std::optional<double> eps_clip_c_, icepop_beta_;
    bool use_tis_;
    double tis_clip_low_, tis_clip_high_;
    bool compute_kl_stats_;
};

} // namespace rl::losses
