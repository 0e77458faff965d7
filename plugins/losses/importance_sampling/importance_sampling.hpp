// importance_sampling: the unclipped importance-sampling policy gradient
// l_t = -ratio_t * A_t, ratio_t = exp(logprobs_t - old_logprobs_t) (xorl /
// Tinker "importance_sampling"), with the shared KL / entropy terms.
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class ImportanceSampling : public PolicyGradientLoss {
public:
    explicit ImportanceSampling(Params &p) {
        refuse_peer_clip_names(p, "importance_sampling is the unclipped ratio (xorl's and "
                                  "Tinker's take no clip either); for a clipped ratio use loss "
                                  "'policy_loss' (eps_clip, eps_clip_high), or drop the parameter");
        compute_kl_stats_ = p.boolean("compute_kl_stats", false);
        read_shared(p);
    }

    void policy(PgCall &c) const override {
        RatioStats rs;
        for (int64_t t : c.tokens()) {
            const double ratio = c.ratio(t);
            c.pg += -c.w[t] * ratio * c.adv[t];
            c.g[t] += -c.w[t] * ratio * c.adv[t];
            c.put("elementwise_loss", t, -ratio * c.adv[t]);
            c.put("ratio", t, ratio);
            rs.add(c.log_ratio(t), c.old[t]);
        }
        rs.emit_ratio(c.r);
        if (compute_kl_stats_) rs.emit_kl(c.r);
    }

private:
    bool compute_kl_stats_;
};

} // namespace rl::losses
