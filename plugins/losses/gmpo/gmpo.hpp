// gmpo: Geometric-Mean Policy Optimization (arXiv 2507.20673; verl "geo_mean").
// Per sequence i, over its n_i loss tokens, with lr_t = logprobs_t - old_logprobs_t:
//   c_t   = lr_t clipped to [-eps_clip, eps_clip_high]                (log space)
//   lr'_t = min(lr_t, c_t) if A_t > 0,  max(lr_t, c_t) if A_t < 0,  0 if A_t = 0
//   s_i   = exp(mean lr'_t),   Abar_i = mean A_t
//   l_t   = -Abar_i * s_i   on every loss token of sequence i
// so seq-mean-token-mean (the default) gives verl's mean over sequences of
// -Abar_i s_i. The gradient is exact: d s_i / d logprobs_u = s_i / n_i where
// the unclipped branch is taken, 0 where the clipped one is.
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class Gmpo : public PolicyGradientLoss {
public:
    explicit Gmpo(Params &p) {
        accept_peer_clip_names(p, "eps_clip", "eps_clip_high");
        eps_clip_ = p.number("eps_clip", 0.4, 0.0);
        eps_clip_high_ = p.number("eps_clip_high", 0.4, 0.0);
        read_shared(p, "seq-mean-token-mean");
    }

    void policy(PgCall &c) const override {
        const Data &d = c.d;
        int64_t clipped = 0;
        Stat seq_ratio;
        std::vector<uint8_t> live(static_cast<size_t>(d.n), 0); // unclipped branch taken
        for (int64_t s = 0; s < d.n_seqs(); ++s) {
            const int64_t ni = d.seq_tokens[s];
            if (ni == 0) continue;
            double sum_lr = 0, sum_adv = 0, weight = 0;
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t) {
                if (d.mask[t] == 0) continue;
                const double A = c.adv[t], lr = c.lp[t] - c.old[t];
                const double lr_c = std::clamp(lr, -eps_clip_, eps_clip_high_);
                double chosen = 0;
                if (A > 0) {
                    chosen = std::min(lr, lr_c);
                    live[t] = lr <= lr_c;
                } else if (A < 0) {
                    chosen = std::max(lr, lr_c);
                    live[t] = lr >= lr_c;
                }
                if (A != 0 && !live[t]) ++clipped;
                sum_lr += chosen;
                sum_adv += A;
                weight += c.w[t];
            }
            const double si = std::exp(sum_lr / double(ni));
            const double abar = sum_adv / double(ni);
            seq_ratio.add(si);
            c.pg += -weight * abar * si;
            // d L / d s_i = -weight * abar; d s_i / d lp_u = s_i / n_i on live tokens.
            const double per_token = -weight * abar * si / double(ni);
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t) {
                if (d.mask[t] == 0) continue;
                if (live[t]) c.g[t] += per_token;
                c.put("elementwise_loss", t, -abar * si);
                c.put("ratio", t, si);
                c.put("clip_mask", t, c.adv[t] != 0 && !live[t]);
            }
        }
        c.token_frac(metrics::kPgClipfrac, clipped);
        emit_seq_ratio(c.r, seq_ratio);
    }

private:
    double eps_clip_, eps_clip_high_;
};

} // namespace rl::losses
