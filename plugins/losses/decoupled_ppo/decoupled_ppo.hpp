// decoupled_ppo: AReaL's decoupled PPO objective. The PPO clip is taken around
// the proximal policy (prox_logprobs) and the result is weighted by the
// behaviour importance weight exp(prox_logprobs - old_logprobs), which does not
// depend on the current policy. Tokens whose behaviour weight exceeds
// behav_imp_weight_cap are dropped (they still count in the normalizer).
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class DecoupledPpo : public PolicyGradientLoss {
public:
    explicit DecoupledPpo(Params &p) {
        accept_peer_clip_names(p, "eps_clip", "eps_clip_higher", "c_clip");
        eps_clip_ = read_eps_clip(p, 0.2);
        eps_clip_higher_ = p.optional_number("eps_clip_higher", 0.0).value_or(eps_clip_);
        c_clip_ = read_optional_above_one(p, "c_clip");
        behav_cap_ = p.optional_number("behav_imp_weight_cap", 0.0);
        if (behav_cap_ && *behav_cap_ <= 0.0)
            invalid(p.owner() + ": parameter 'behav_imp_weight_cap' must be > 0 (or null for off)");
        read_shared(p);
    }

    void add_inputs(LossSignature &s) const override {
        s.required.insert(s.required.begin() + 2, "prox_logprobs");
    }

    void policy(PgCall &c) const override {
        const auto &prox = c.d.at("prox_logprobs");
        int64_t clipped = 0, dual_clipped = 0, behav_masked = 0;
        Stat ratio_s, approx_kl, behav_w, behav_kl;
        for (int64_t t : c.tokens()) {
            const double ratio = std::exp(c.lp[t] - prox[t]);
            ratio_s.add(ratio);
            approx_kl.add(c.lp[t] - prox[t]);
            const PpoTerm ppo =
                ppo_clip(c.adv[t], ratio, 1.0 - eps_clip_, 1.0 + eps_clip_higher_, c_clip_);
            clipped += ppo.clipped;
            dual_clipped += ppo.dual_clipped;
            const double bw = std::exp(prox[t] - c.old[t]);
            if (behav_cap_ && bw > *behav_cap_) {
                ++behav_masked;
                continue;
            }
            behav_w.add(bw);
            behav_kl.add(prox[t] - c.old[t]);
            c.pg += c.w[t] * bw * ppo.loss;
            c.g[t] += c.w[t] * bw * ppo.dloss;
        }
        c.metric(metrics::kPgClipfrac, c.frac(clipped));
        if (c_clip_) c.metric(metrics::kDualClipfrac, c.frac(dual_clipped));
        c.metric(metrics::kRatioMean, ratio_s.mean(1.0));
        c.metric(metrics::kApproxKl, approx_kl.mean());
        c.metric(metrics::kBehavImpWeight, behav_w.mean(1.0));
        c.metric(metrics::kBehavApproxKl, behav_kl.mean());
        if (behav_cap_) c.metric(metrics::kBehavMaskfrac, c.frac(behav_masked));
    }

private:
    double eps_clip_, eps_clip_higher_;
    std::optional<double> c_clip_, behav_cap_;
};

} // namespace rl::losses
