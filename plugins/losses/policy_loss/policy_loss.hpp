// policy_loss: PPO's clipped surrogate with xorl's options (asymmetric clip,
// dual clip, IcePop, TIS), the shared KL / entropy terms and every
// loss_agg_mode. Formulas and metrics: docs/losses.md.
#pragma once

#include "../common/loss_common.hpp"

namespace rl::losses {

class PolicyLoss : public LossPlugin {
public:
    explicit PolicyLoss(Params &p) {
        eps_clip_ = p.number("eps_clip", 0.2, 0.0, 1.0);
        if (eps_clip_ >= 1.0)
            invalid(p.owner() +
                    ": parameter 'eps_clip' must be < 1 (the lower bound is 1 - eps_clip)");
        eps_clip_high_ = p.number("eps_clip_high", 0.2, 0.0);
        eps_clip_c_ = p.optional_number("eps_clip_c", 1.0);
        if (eps_clip_c_ && *eps_clip_c_ <= 1.0)
            invalid(p.owner() + ": parameter 'eps_clip_c' must be > 1 (or null for off), got " +
                    num(*eps_clip_c_));
        icepop_beta_ = p.optional_number("icepop_beta", 1.0);
        if (icepop_beta_ && *icepop_beta_ <= 1.0)
            invalid(p.owner() + ": parameter 'icepop_beta' must be > 1 (or null for off), got " +
                    num(*icepop_beta_));
        use_tis_ = p.boolean("use_tis", false);
        tis_clip_low_ = p.number("tis_clip_low", 0.1, 0.0);
        tis_clip_high_ = p.number("tis_clip_high", 2.0, 0.0);
        if (tis_clip_high_ < tis_clip_low_)
            invalid(p.owner() + ": parameter 'tis_clip_high' (" + num(tis_clip_high_) +
                    ") must be >= 'tis_clip_low' (" + num(tis_clip_low_) + ")");
        compute_kl_stats_ = p.boolean("compute_kl_stats", false);
        agg_ = Aggregation::read(p);
        reg_.read(p);
    }

    LossSignature signature() const override {
        LossSignature s{{"logprobs", "old_logprobs", "advantages"}, {"loss_mask"}, {"logprobs"}};
        if (use_tis_) s.required.push_back("rollout_logprobs");
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
        const auto *roll = use_tis_ ? &d.at("rollout_logprobs") : nullptr;
        auto &g = r.g("logprobs", d.n);
        const double lo = 1.0 - eps_clip_, hi = 1.0 + eps_clip_high_;
        int64_t clipped = 0, icepop_masked = 0, tis_clipped = 0;
        Stat tis;
        RatioStats rs;
        double pg = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double A = adv[t];
            const double ratio = std::exp(lp[t] - old[t]);
            // PPO: max(-A r, -A clip(r)); the clipped branch has no gradient.
            const double l1 = -A * ratio, l2 = -A * std::clamp(ratio, lo, hi);
            double l = l1, dl = -A * ratio;
            bool is_clipped = false;
            if (l2 > l1) {
                l = l2;
                dl = 0;
                is_clipped = true;
            }
            // Dual clip (A < 0): min(l, -A c).
            if (eps_clip_c_ && A < 0) {
                const double l3 = -A * *eps_clip_c_;
                if (l3 < l) {
                    l = l3;
                    dl = 0;
                    is_clipped = true;
                }
            }
            if (is_clipped) ++clipped;
            // Detached quantities come from the stop-gradient view.
            const double log_ratio_sg = lp_sg[t] - old[t];
            const double ratio_sg = std::exp(log_ratio_sg);
            rs.add(log_ratio_sg, old[t]);
            double keep = 1.0;
            if (icepop_beta_ && (ratio_sg < 1.0 / *icepop_beta_ || ratio_sg > *icepop_beta_)) {
                keep = 0.0;
                ++icepop_masked;
            }
            double tis_w = 1.0;
            if (roll) {
                const double raw = std::exp(lp_sg[t] - (*roll)[t]);
                tis_w = std::clamp(raw, tis_clip_low_, tis_clip_high_);
                if (tis_w != raw) ++tis_clipped;
                tis.add(raw);
            }
            if (keep != 0) {
                pg += w[t] * tis_w * l;
                g[t] += w[t] * tis_w * dl;
            }
        }
        r.loss = pg;
        r.metric("pg_loss", pg);
        r.metric("pg_clipfrac", frac(clipped, d.loss_tokens));
        if (icepop_beta_) r.metric("icepop_maskfrac", frac(icepop_masked, d.loss_tokens));
        if (use_tis_) {
            r.metric("tis_mean", tis.mean(1.0));
            r.metric("tis_min", tis.min(1.0));
            r.metric("tis_max", tis.max(1.0));
            r.metric("tis_clipfrac", frac(tis_clipped, d.loss_tokens));
        }
        if (compute_kl_stats_) {
            rs.emit_kl(r);
            rs.emit_ratio(r);
        }
        r.metric("valid_tokens", double(d.loss_tokens));
        reg_.apply(d, sg, w, r);
        return r;
    }

private:
    double eps_clip_, eps_clip_high_;
    std::optional<double> eps_clip_c_, icepop_beta_;
    bool use_tis_;
    double tis_clip_low_, tis_clip_high_;
    bool compute_kl_stats_;
    Aggregation agg_;
    Regularizers reg_;
};

} // namespace rl::losses
