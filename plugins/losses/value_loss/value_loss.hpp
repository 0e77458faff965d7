// value_loss: the PPO critic's squared-error loss against returns, optionally
// clipped around the values of the rollout (old_values):
//   l_t = vf_coef * 0.5 * max((v_t - R_t)^2, (clip(v_t, old_t - vf_clip, old_t + vf_clip) - R_t)^2)
#pragma once

#include "../common/loss_common.hpp"

namespace rl::losses {

class ValueLoss : public LossPlugin {
public:
    explicit ValueLoss(Params &p) {
        vf_clip_ = p.optional_number("vf_clip", 0.0);
        vf_coef_ = p.number("vf_coef", 1.0, 0.0);
        agg_ = Aggregation::read(p);
    }

    LossSignature signature() const override {
        LossSignature s{{"values", "returns"}, {"loss_mask"}, {"values"}};
        if (vf_clip_) s.required.push_back("old_values");
        return s;
    }

    Result evaluate(const Data &d, const Data &) const override {
        Result r;
        const auto w = agg_.weights(d);
        const auto &v = d.at("values");
        const auto &R = d.at("returns");
        const auto *old = vf_clip_ ? &d.at("old_values") : nullptr;
        auto &g = r.g("values", d.n);
        Stat value, ret, err;
        int64_t clipped = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double e1 = v[t] - R[t];
            double l = e1 * e1, dl = 2 * e1;
            if (old) {
                const double vc = std::clamp(v[t], (*old)[t] - *vf_clip_, (*old)[t] + *vf_clip_);
                const double e2 = vc - R[t];
                // Where the clipped error is larger, v lies outside the band, so
                // the clipped branch has no gradient.
                if (e2 * e2 > l) {
                    l = e2 * e2;
                    dl = 0;
                    ++clipped;
                }
            }
            r.loss += w[t] * vf_coef_ * 0.5 * l;
            g[t] = w[t] * vf_coef_ * 0.5 * dl;
            value.add(v[t]);
            ret.add(R[t]);
            err.add(e1 * e1);
        }
        r.metric("value_mean", value.mean());
        r.metric("return_mean", ret.mean());
        r.metric("value_error_sq_mean", err.mean());
        if (vf_clip_) r.metric("vf_clipfrac", frac(clipped, d.loss_tokens));
        r.metric("valid_tokens", double(d.loss_tokens));
        return r;
    }

private:
    std::optional<double> vf_clip_;
    double vf_coef_;
    Aggregation agg_;
};

} // namespace rl::losses
