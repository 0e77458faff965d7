// decoupled_ppo: AReaL's decoupled PPO objective (areal/utils/functional
// ppo_actor_loss_fn). The PPO clip is taken around the proximal policy
// (prox_logprobs) and the result is weighted by the behaviour importance weight
// b_t = exp(prox_logprobs - old_logprobs), which does not depend on the current
// policy. AReaL's rejection sampling filters or truncates b (token or sequence
// level, ratio or KL metric, lower and upper bounds); its older
// behave_imp_weight_cap / behave_imp_weight_mode are shorthands for it. Tokens
// rejected by the mask action are dropped (they still count in the
// normalizer). importance_sampling_level "sequence" takes GSPO's sequence
// ratio around the proximal policy, with the sequence-mean advantage.
#pragma once

#include <rl/sdk/pg_loss.hpp>
#include <rl/sdk/rejection.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class DecoupledPpo : public PolicyGradientLoss {
public:
    explicit DecoupledPpo(Params &p) {
        accept_peer_clip_names(p, "eps_clip", "eps_clip_higher", "c_clip");
        p.alias("behave_imp_weight_cap", "behav_imp_weight_cap", "AReaL");
        p.alias("behave_imp_weight_mode", "behav_imp_weight_mode", "AReaL");
        eps_clip_ = read_eps_clip(p, 0.2);
        eps_clip_higher_ = p.optional_number("eps_clip_higher", 0.0).value_or(eps_clip_);
        c_clip_ = read_optional_above_one(p, "c_clip");
        const auto cap = p.optional_number("behav_imp_weight_cap", 0.0);
        if (cap && *cap <= 0.0)
            invalid(p.owner() + ": parameter 'behav_imp_weight_cap' must be > 0 (or null for off)");
        const bool mode_given = p.has("behav_imp_weight_mode");
        const std::string mode = p.choice(
            "behav_imp_weight_mode", "token_mask",
            {"disabled", "token_mask", "token_truncate", "sequence_mask", "sequence_truncate"});
        if (p.has("rejection_sampling")) {
            if (cap || mode_given)
                invalid(p.owner() + ": give either 'rejection_sampling' or the older "
                                    "'behav_imp_weight_cap' / 'behav_imp_weight_mode', not both");
            rs_ = RejectionSampling::read(p);
        } else if (mode == "disabled") {
            if (cap)
                invalid(p.owner() +
                        ": 'behav_imp_weight_cap' has no effect with behav_imp_weight_mode "
                        "'disabled'");
            no_behav_weight_ = true; // AReaL's 'disabled': no behaviour weight at all
        } else if (cap) {
            // AReaL's migration: {level, action: mask | clamp, metric: ratio, upper: cap}.
            RejectionSampling rs;
            rs.sequence = mode.rfind("sequence", 0) == 0;
            rs.clamp = mode.find("truncate") != std::string::npos;
            rs.upper = *cap;
            if (rs.clamp) rs.lower = 0.0;
            rs_ = rs;
        } else if (mode_given) {
            invalid(p.owner() + ": behav_imp_weight_mode '" + mode +
                    "' needs 'behav_imp_weight_cap'");
        }
        sequence_is_ =
            p.choice("importance_sampling_level", "token", {"token", "sequence"}) == "sequence";
        own_rejection_sampling_ = true; // around prox_logprobs, not the base's option
        read_shared(p);
    }

    void add_inputs(LossSignature &s) const override {
        s.required.insert(s.required.begin() + 2, "prox_logprobs");
    }

    void policy(PgCall &c) const override {
        const Data &d = c.d;
        const auto &prox = c.d.at("prox_logprobs");
        // Behaviour weights and the tokens rejection sampling keeps (all data).
        std::vector<double> bw(static_cast<size_t>(d.n), 0.0);
        std::vector<uint8_t> keep(static_cast<size_t>(d.n), 0);
        int64_t filtered = 0;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            bw[t] = no_behav_weight_ ? 1.0 : std::exp(prox[t] - c.old[t]);
            keep[t] = 1;
        }
        if (rs_) filtered = rs_->apply(d, prox, c.old, bw, keep);

        // The PPO ratio around the proximal policy: per token, or per sequence over its
        // kept tokens (GSPO) with the sequence-mean advantage.
        std::vector<double> ratio(static_cast<size_t>(d.n), 1.0), adv = c.adv;
        std::vector<int64_t> kept_in_seq(static_cast<size_t>(d.n_seqs()), 0);
        for (int64_t t = 0; t < d.n; ++t)
            if (d.mask[t] != 0) ratio[t] = std::exp(c.lp[t] - prox[t]);
        if (sequence_is_) {
            for (int64_t s = 0; s < d.n_seqs(); ++s) {
                double sum_lr = 0, sum_a = 0;
                int64_t k = 0;
                for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
                    if (keep[t]) {
                        sum_lr += c.lp[t] - prox[t];
                        sum_a += c.adv[t];
                        ++k;
                    }
                kept_in_seq[s] = k;
                if (!k) continue;
                const double si = std::exp(sum_lr / double(k)), abar = sum_a / double(k);
                for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
                    if (keep[t]) {
                        ratio[t] = si;
                        adv[t] = abar;
                    }
            }
        }

        int64_t clipped = 0, dual_clipped = 0;
        Stat ratio_s, approx_kl, behav_w, behav_kl;
        std::vector<double> dl_dlr_seq(static_cast<size_t>(d.n_seqs()), 0.0);
        for (int64_t t : c.tokens()) {
            // Statistics over every loss token at token level (rejected ones too, as
            // AReaL's older cap did); at sequence level over the kept tokens, the
            // only ones with a sequence ratio.
            approx_kl.add(c.lp[t] - prox[t]);
            if (rs_) c.put("rejection_mask", t, !keep[t]);
            if (sequence_is_ && !keep[t]) continue;
            ratio_s.add(ratio[t]);
            const PpoTerm ppo =
                ppo_clip(adv[t], ratio[t], 1.0 - eps_clip_, 1.0 + eps_clip_higher_, c_clip_);
            clipped += ppo.clipped;
            dual_clipped += ppo.dual_clipped;
            c.put("ratio", t, ratio[t]);
            c.put("clip_mask", t, ppo.clipped);
            if (c_clip_) c.put("dual_clip_mask", t, ppo.dual_clipped);
            c.put("behave_imp_weight", t, bw[t]);
            if (!keep[t]) continue;
            c.put("elementwise_loss", t, bw[t] * ppo.loss);
            if (bw[t] > 0) {
                behav_w.add(bw[t]);
                behav_kl.add(prox[t] - c.old[t]);
            }
            c.pg += c.w[t] * bw[t] * ppo.loss;
            if (sequence_is_)
                dl_dlr_seq[d.seq[t]] += c.w[t] * bw[t] * ppo.dloss; // d L / d (mean log ratio)
            else
                c.g[t] += c.w[t] * bw[t] * ppo.dloss;
        }
        if (sequence_is_)
            for (int64_t t = 0; t < d.n; ++t)
                if (keep[t]) c.g[t] += dl_dlr_seq[d.seq[t]] / double(kept_in_seq[d.seq[t]]);

        c.token_frac(metrics::kPgClipfrac, clipped);
        if (c_clip_) c.token_frac(metrics::kDualClipfrac, dual_clipped);
        ratio_s.emit_mean(c.r, metrics::kRatioMean, 1.0);
        approx_kl.emit_mean(c.r, metrics::kApproxKl);
        behav_w.emit_mean(c.r, metrics::kBehavImpWeight, 1.0);
        behav_kl.emit_mean(c.r, metrics::kBehavApproxKl);
        if (rs_) c.token_frac(rs_->frac_metric(), filtered);
    }

private:
    double eps_clip_, eps_clip_higher_;
    std::optional<double> c_clip_;
    std::optional<RejectionSampling> rs_;
    bool sequence_is_ = false;
    bool no_behav_weight_ = false;
};

} // namespace rl::losses
