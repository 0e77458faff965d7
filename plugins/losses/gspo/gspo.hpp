// gspo: Group Sequence Policy Optimization. The importance ratio is the
// sequence's geometric mean s_i = exp(mean over its loss tokens of
// (logprobs - old_logprobs)), clipped PPO-style per token:
//   l_t = max(-A_t s_i, -A_t clip(s_i, 1 - eps_clip, 1 + eps_clip_high)).
// The gradient is exact: d s_i / d logprobs_u = s_i / n_i for every loss token
// u of sequence i (with sequence-constant advantages and seq-mean-token-mean
// this is GSPO's gradient; GSPO-token's stop-gradient form agrees there).
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class Gspo : public PolicyGradientLoss {
public:
    explicit Gspo(Params &p) {
        clip_ = read_clip_bounds(p, 3e-4, 4e-4);
        read_shared(p, "seq-mean-token-mean");
    }

    void policy(PgCall &c) const override {
        const Data &d = c.d;
        int64_t clipped = 0;
        Stat seq_ratio;
        for (int64_t s = 0; s < d.n_seqs(); ++s) {
            const int64_t ni = d.seq_tokens[s];
            if (ni == 0) continue;
            const double si = seq_geo_ratio(d, c.lp, c.old, s);
            seq_ratio.add(si);
            double dL_dsi = 0; // d loss / d s_i
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t) {
                if (d.mask[t] == 0) continue;
                const PpoTerm ppo = ppo_clip(c.adv[t], si, clip_.lo, clip_.hi);
                c.pg += c.w[t] * ppo.loss;
                c.put("elementwise_loss", t, ppo.loss);
                c.put("ratio", t, si);
                c.put("clip_mask", t, ppo.clipped);
                if (ppo.clipped)
                    ++clipped;
                else
                    dL_dsi += -c.w[t] * c.adv[t];
            }
            const double per_token = dL_dsi * si / double(ni);
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
                if (d.mask[t] != 0) c.g[t] += per_token;
        }
        c.token_frac(metrics::kPgClipfrac, clipped);
        emit_seq_ratio(c.r, seq_ratio);
    }

private:
    ClipBounds clip_;
};

} // namespace rl::losses
