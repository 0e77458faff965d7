// value_loss: the PPO critic's squared-error loss against returns, optionally
// clipped around the values of the rollout (old_values):
//   l_t = vf_coef * max(h(v_t - R_t), h(clip(v_t, old_t - vf_clip, old_t + vf_clip) - R_t))
// with h(e) = e^2 / 2, or with huber_delta the Huber loss
//   h(e) = e^2 / 2 for |e| <= delta, delta * (|e| - delta / 2) beyond.
#pragma once

#include <rl/sdk/loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class ValueLoss : public LossBase {
public:
    explicit ValueLoss(Params &p) {
        vf_clip_ = p.optional_number("vf_clip", 0.0);
        vf_coef_ = p.number("vf_coef", 1.0, 0.0);
        huber_delta_ = p.optional_number("huber_delta", 0.0);
        if (huber_delta_ && *huber_delta_ <= 0.0)
            invalid(p.owner() +
                    ": parameter 'huber_delta' must be > 0 (or null for squared error), got " +
                    num(*huber_delta_));
        agg_ = Aggregation::read(p);
    }

    LossSignature signature() const override {
        LossSignature s{{"values", "returns"}, {"loss_mask", "weights"}, {"values"}};
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
        int64_t clipped = 0, linear = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double e1 = v[t] - R[t];
            // Both branches are increasing in |e|, so the larger loss is the
            // larger |error|.
            double e = e1;
            bool from_clip = false;
            if (old) {
                const double vc = std::clamp(v[t], (*old)[t] - *vf_clip_, (*old)[t] + *vf_clip_);
                const double e2 = vc - R[t];
                // Where the clipped error is larger, v lies outside the band, so
                // the clipped branch has no gradient.
                if (e2 * e2 > e1 * e1) {
                    e = e2;
                    from_clip = true;
                    ++clipped;
                }
            }
            double l = 0.5 * (e * e), dl = e; // h(e), h'(e)
            if (huber_delta_ && std::fabs(e) > *huber_delta_) {
                l = *huber_delta_ * (std::fabs(e) - 0.5 * *huber_delta_);
                dl = e > 0 ? *huber_delta_ : -*huber_delta_;
                ++linear;
            }
            r.loss += w[t] * vf_coef_ * l;
            g[t] = from_clip ? 0.0 : w[t] * vf_coef_ * dl;
            value.add(v[t]);
            ret.add(R[t]);
            err.add(e1 * e1);
        }
        value.emit_mean(r, metrics::kValueMean);
        ret.emit_mean(r, metrics::kReturnMean);
        err.emit_mean(r, metrics::kValueErrorSqMean);
        if (vf_clip_)
            r.token_mean(metrics::kVfClipfrac, frac(clipped, d.loss_tokens), d.loss_tokens);
        if (huber_delta_)
            r.token_mean(metrics::kHuberLinearFrac, frac(linear, d.loss_tokens), d.loss_tokens);
        r.sum(metrics::kValidTokens, double(d.loss_tokens));
        return r;
    }

private:
    std::optional<double> vf_clip_;
    double vf_coef_;
    std::optional<double> huber_delta_;
    Aggregation agg_;
};

} // namespace rl::losses
