// gspo: Group Sequence Policy Optimization. The importance ratio is the
// sequence's geometric mean s_i = exp(mean over its loss tokens of
// (logprobs - old_logprobs)), clipped PPO-style per token:
//   l_t = max(-A_t s_i, -A_t clip(s_i, 1 - eps_clip, 1 + eps_clip_high)).
// The gradient is exact: d s_i / d logprobs_u = s_i / n_i for every loss token
// u of sequence i (with sequence-constant advantages and seq-mean-token-mean
// this is GSPO's gradient; GSPO-token's stop-gradient form agrees there).
#pragma once

#include "../common/loss_common.hpp"

namespace rl::losses {

class Gspo : public LossPlugin {
public:
    explicit Gspo(Params &p) {
        eps_clip_ = p.number("eps_clip", 3e-4, 0.0, 1.0);
        if (eps_clip_ >= 1.0)
            invalid(p.owner() +
                    ": parameter 'eps_clip' must be < 1 (the lower bound is 1 - eps_clip)");
        eps_clip_high_ = p.number("eps_clip_high", 4e-4, 0.0);
        agg_ = Aggregation::read(p, "seq-mean-token-mean");
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
        const double lo = 1.0 - eps_clip_, hi = 1.0 + eps_clip_high_;
        int64_t clipped = 0;
        Stat seq_ratio;
        double pg = 0;
        for (int64_t s = 0; s < d.n_seqs(); ++s) {
            const int64_t ni = d.seq_tokens[s];
            if (ni == 0) continue;
            double sum = 0;
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
                if (d.mask[t] != 0) sum += lp[t] - old[t];
            const double si = std::exp(sum / double(ni));
            seq_ratio.add(si);
            double dL_dsi = 0; // d loss / d s_i
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t) {
                if (d.mask[t] == 0) continue;
                const double A = adv[t];
                const double l1 = -A * si, l2 = -A * std::clamp(si, lo, hi);
                if (l2 > l1) {
                    pg += w[t] * l2;
                    ++clipped;
                } else {
                    pg += w[t] * l1;
                    dL_dsi += -w[t] * A;
                }
            }
            const double per_token = dL_dsi * si / double(ni);
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
                if (d.mask[t] != 0) g[t] += per_token;
        }
        r.loss = pg;
        r.metric("pg_loss", pg);
        r.metric("pg_clipfrac", frac(clipped, d.loss_tokens));
        r.metric("seq_ratio_mean", seq_ratio.mean(1.0));
        r.metric("seq_ratio_min", seq_ratio.min(1.0));
        r.metric("seq_ratio_max", seq_ratio.max(1.0));
        r.metric("valid_tokens", double(d.loss_tokens));
        reg_.apply(d, sg, w, r);
        return r;
    }

private:
    double eps_clip_, eps_clip_high_;
    Aggregation agg_;
    Regularizers reg_;
};

} // namespace rl::losses
