// importance_sampling: the unclipped importance-sampling policy gradient
// l_t = -ratio_t * A_t, ratio_t = exp(logprobs_t - old_logprobs_t) (xorl /
// Tinker "importance_sampling"), with the shared KL / entropy terms.
#pragma once

#include "../common/loss_common.hpp"

namespace rl::losses {

class ImportanceSampling : public LossPlugin {
public:
    explicit ImportanceSampling(Params &p) {
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
        const auto &old = d.at("old_logprobs");
        const auto &adv = d.at("advantages");
        auto &g = r.g("logprobs", d.n);
        RatioStats rs;
        double pg = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double ratio = std::exp(lp[t] - old[t]);
            pg += -w[t] * ratio * adv[t];
            g[t] += -w[t] * ratio * adv[t];
            rs.add(lp[t] - old[t], old[t]);
        }
        r.loss = pg;
        r.metric("pg_loss", pg);
        rs.emit_ratio(r);
        if (compute_kl_stats_) rs.emit_kl(r);
        r.metric("valid_tokens", double(d.loss_tokens));
        reg_.apply(d, sg, w, r);
        return r;
    }

private:
    bool compute_kl_stats_;
    Aggregation agg_;
    Regularizers reg_;
};

} // namespace rl::losses
