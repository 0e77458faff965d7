// cispo: CISPO (MiniMax-M1) as xorl / Tinker define it: the importance ratio,
// clipped to [clip_low, clip_high] and detached, weights the plain policy
// gradient: l_t = -sg(clip(ratio_t)) * A_t * logprobs_t. Every loss token keeps
// a gradient; clipping only bounds its weight.
#pragma once

#include "../common/loss_common.hpp"

namespace rl::losses {

class Cispo : public LossPlugin {
public:
    explicit Cispo(Params &p) {
        clip_low_ = p.number("clip_low", 0.0, 0.0);
        clip_high_ = p.number("clip_high", 4.0, 0.0);
        if (clip_high_ < clip_low_)
            invalid(p.owner() + ": parameter 'clip_high' (" + num(clip_high_) +
                    ") must be >= 'clip_low' (" + num(clip_low_) + ")");
        compute_kl_stats_ = p.boolean("compute_kl_stats", false);
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
        RatioStats rs;
        int64_t clipped = 0;
        double pg = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double ratio = std::exp(lp_sg[t] - old[t]);
            const double c = std::clamp(ratio, clip_low_, clip_high_);
            if (c != ratio) ++clipped;
            rs.add(lp_sg[t] - old[t], old[t]);
            pg += -w[t] * c * adv[t] * lp[t];
            g[t] += -w[t] * c * adv[t];
        }
        r.loss = pg;
        r.metric("pg_loss", pg);
        rs.emit_ratio(r);
        r.metric("clip_fraction", frac(clipped, d.loss_tokens));
        if (compute_kl_stats_) rs.emit_kl(r);
        r.metric("valid_tokens", double(d.loss_tokens));
        reg_.apply(d, sg, w, r);
        return r;
    }

private:
    double clip_low_, clip_high_;
    bool compute_kl_stats_;
    Aggregation agg_;
    Regularizers reg_;
};

} // namespace rl::losses
