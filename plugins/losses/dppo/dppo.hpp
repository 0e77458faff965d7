// dppo and ipo: prime-rl's RL losses (prime-rl src/prime_rl/trainer/rl/loss.py,
// `default` and `ipo` loss types), with its rl / ce / ref-KL components and
// per-token weight streams.
//
// With r_t = exp(logprobs_t - old_logprobs_t) (old = the inference policy), the
// probability difference dp_t = exp(logprobs_t) - exp(old_logprobs_t) (detached)
// decides a binary trust region:
//   dppo (DPPO-Binary-TV): masked where A_t > 0 and dp_t > dppo_mask_high, or
//                          A_t <= 0 and dp_t < -dppo_mask_low
//   ipo:                   masked where dp_t > ipo_mask_high or dp_t < -ipo_mask_low
//                          (both default to ipo_threshold: |dp_t| > ipo_threshold)
// and the rl component's per-token loss is
//   l_t = -(1 - m_t) A'_t r_t + kl_tau (logprobs_t - old_logprobs_t)^2
// with A'_t = adv_tau A_t + teacher_tau sg(teacher_logprobs_t - logprobs_t).
// Surogate's ratio_clip = c caps the ratio of the policy term: r_t is replaced
// by sg(min(r_t, c) / r_t) r_t (value -A' min(r, c), gradient -A' min(r, c)),
// (the squared log ratio is taken on masked tokens too). Its gradient is
// -(1 - m_t) adv_tau A_t r_t + 2 kl_tau log r_t.
//
// Optional components, each over its own tokens (loss tokens whose weight is
// non-zero) and aggregated by loss_agg_mode over those tokens alone:
//   ce:     l_t = -logprobs_t                                       (ce_weights)
//   ref_kl: l_t = -(1 - m'_t) sg(ref_t - logprobs_t) r_t + ref_kl_tau (log r_t)^2
//           m'_t = dp_t < -ref_kl_mask_low                          (ref_kl_weights)
// Each weight stream multiplies its component's per-token loss; rl_weights
// (default 1) multiplies the rl component's.
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class PrimeRlLoss : public PolicyGradientLoss {
public:
    enum class Region { BinaryTv, Ipo };

    PrimeRlLoss(Params &p, Region region) : region_(region) {
        if (region_ == Region::BinaryTv) {
            mask_low_ = p.number("dppo_mask_low", 0.2, 0.0);
            mask_high_ = p.number("dppo_mask_high", 0.2, 0.0);
        } else {
            // Surogate's asymmetric bounds; each defaults to prime-rl's threshold.
            const double thr = p.number("ipo_threshold", 0.1, 0.0);
            mask_low_ = p.number("ipo_mask_low", thr, 0.0);
            mask_high_ = p.number("ipo_mask_high", thr, 0.0);
        }
        teacher_tau_ = p.number("teacher_tau", 0.0, 0.0);
        ratio_clip_ = p.optional_number("ratio_clip", 0.0);
        if (ratio_clip_ && *ratio_clip_ <= 0)
            invalid(p.owner() + ": parameter 'ratio_clip' must be > 0 (or null for off), got " +
                    num(*ratio_clip_));
        adv_tau_ = p.number("adv_tau", 1.0, 0.0);
        kl_tau_ = p.number("kl_tau", 1e-3, 0.0);
        ref_kl_mask_low_ = p.number("ref_kl_mask_low", 0.2, 0.0);
        ref_kl_tau_ = p.number("ref_kl_tau", 1e-3, 0.0);
        read_shared(p);
    }

    void add_inputs(LossSignature &s) const override {
        for (const char *n : {"rl_weights", "ce_weights", "ref_kl_weights"})
            s.optional.push_back(n);
        (teacher_tau_ != 0 ? s.required : s.optional).push_back("teacher_logprobs");
    }

    void policy(PgCall &c) const override {
        const Data &d = c.d;
        const auto *rl_w = weights(d, "rl_weights");
        const auto *ce_w = weights(d, "ce_weights");
        const auto *rk_w = weights(d, "ref_kl_weights");
        if (rk_w && !d.has("ref_logprobs"))
            invalid("input 'ref_kl_weights' needs input 'ref_logprobs' (the ref_kl component "
                    "is the reverse KL to the reference model)");
        if ((ce_w || rk_w) && (d.global_tokens > 0 || d.global_seqs > 0) &&
            aggregation().mode != AggMode::Sum)
            invalid(std::string("input '") + (ce_w ? "ce_weights" : "ref_kl_weights") +
                    "' with global_tokens / global_seqs: the call carries the rl component's "
                    "global counts only; use loss_agg_mode 'sum' and put each component's "
                    "normalizer into its weights");

        const auto &lp_sg = c.lp_sg;
        auto prob_diff = [&](int64_t t) { return std::exp(lp_sg[t]) - std::exp(c.old[t]); };

        // rl component.
        int64_t masked = 0, masked_low = 0, masked_high = 0, masked_pos = 0, masked_neg = 0;
        int64_t ratio_clipped = 0;
        Stat kl_masked, kl_kept, teacher_kl;
        const auto *teacher = d.find("teacher_logprobs");
        double rl = 0;
        for (int64_t t : c.tokens()) {
            const double A = c.adv[t], dp = prob_diff(t);
            bool m;
            if (region_ == Region::BinaryTv) {
                m = A > 0 ? dp > mask_high_ : dp < -mask_low_;
                masked_high += A > 0 && m;
                masked_low += A < 0 && m;
            } else {
                m = dp > mask_high_ || dp < -mask_low_;
            }
            const double lr_sg = c.log_ratio_sg(t);
            const double mismatch = std::exp(lr_sg) - lr_sg - 1.0;
            if (m) {
                ++masked;
                masked_pos += A > 0;
                masked_neg += A < 0;
                kl_masked.add(mismatch);
            } else {
                kl_kept.add(mismatch);
            }
            const double lr = c.log_ratio(t), r = std::exp(lr), wt = rl_w ? (*rl_w)[t] : 1.0;
            double a = adv_tau_ * A;
            if (teacher) {
                a += teacher_tau_ * ((*teacher)[t] - lp_sg[t]);
                teacher_kl.add((*teacher)[t] - lp_sg[t]);
            }
            // ratio_clip: the detached factor min(r, c) / r caps value and gradient.
            double k = 1.0;
            if (ratio_clip_ && c.ratio_sg(t) > *ratio_clip_) {
                k = *ratio_clip_ / c.ratio_sg(t);
                ratio_clipped += !m;
            }
            const double pg = m ? 0.0 : -a * k * r;
            const double l = wt * (pg + kl_tau_ * lr * lr);
            rl += c.w[t] * l;
            c.pg += c.w[t] * l;
            c.g[t] += c.w[t] * wt * (pg + 2.0 * kl_tau_ * lr);
            c.put("elementwise_loss", t, l);
            c.put("is_masked", t, m);
        }
        c.r.sum("rl_loss", rl);
        c.token_frac("is_masked", masked);
        if (region_ == Region::BinaryTv) {
            c.token_frac("is_masked_low", masked_low);
            c.token_frac("is_masked_high", masked_high);
            c.r.token_mean("masked_advantage_positive", frac(masked_pos, masked), masked);
            c.r.token_mean("masked_advantage_negative", frac(masked_neg, masked), masked);
        }
        kl_masked.emit_mean(c.r, "masked_mismatch_kl");
        kl_kept.emit_mean(c.r, "unmasked_mismatch_kl");
        if (ratio_clip_) c.token_frac("ratio_clipped", ratio_clipped);
        if (teacher) teacher_kl.emit_mean(c.r, metrics::kTeacherKl);

        // ce component: masked negative log-likelihood.
        if (ce_w) {
            const Data cd = component(d, *ce_w);
            const auto w = aggregation().weights(cd);
            double ce = 0;
            Stat nll;
            for (int64_t t = 0; t < d.n; ++t) {
                if (cd.mask[t] == 0) continue;
                ce += -w[t] * (*ce_w)[t] * c.lp[t];
                c.g[t] += -w[t] * (*ce_w)[t];
                nll.add(-c.lp[t]);
            }
            c.pg += ce;
            c.r.sum("ce_loss", ce);
            nll.emit_mean(c.r, "nll");
            c.r.sum("ce_tokens", double(cd.loss_tokens));
        }

        // ref_kl component: the reverse KL to the reference as the advantage.
        if (rk_w) {
            const auto &ref = d.at("ref_logprobs");
            const auto &ref_sg = c.sg.at("ref_logprobs");
            const Data kd = component(d, *rk_w);
            const auto w = aggregation().weights(kd);
            double loss = 0;
            int64_t rk_masked = 0;
            Stat kl_m, kl_k, adv;
            for (int64_t t = 0; t < d.n; ++t) {
                if (kd.mask[t] == 0) continue;
                const bool m = prob_diff(t) < -ref_kl_mask_low_;
                const double lr_sg = c.log_ratio_sg(t);
                const double mismatch = std::exp(lr_sg) - lr_sg - 1.0;
                (m ? kl_m : kl_k).add(mismatch);
                rk_masked += m;
                const double a = ref_sg[t] - lp_sg[t]; // detached
                adv.add(ref[t] - c.lp[t]);
                const double lr = c.log_ratio(t), r = std::exp(lr), wt = (*rk_w)[t];
                const double pg = m ? 0.0 : -a * r;
                loss += w[t] * wt * (pg + ref_kl_tau_ * lr * lr);
                c.g[t] += w[t] * wt * (pg + 2.0 * ref_kl_tau_ * lr);
            }
            c.pg += loss;
            c.r.sum("ref_kl_loss", loss);
            c.r.token_mean("ref_kl_is_masked", frac(rk_masked, kd.loss_tokens), kd.loss_tokens);
            kl_m.emit_mean(c.r, "ref_kl_masked_mismatch_kl");
            kl_k.emit_mean(c.r, "ref_kl_unmasked_mismatch_kl");
            adv.emit_mean(c.r, "ref_kl_reverse");
            c.r.sum("ref_kl_tokens", double(kd.loss_tokens));
        }
    }

private:
    // A weight stream, checked: finite (the reader checks) and >= 0.
    static const std::vector<double> *weights(const Data &d, const char *name) {
        const auto *w = d.find(name);
        if (!w) return nullptr;
        for (int64_t t = 0; t < d.n; ++t)
            if ((*w)[t] < 0)
                invalid(std::string("input '") + name + "' must be >= 0, got " + num((*w)[t]) +
                        " at token " + std::to_string(t));
        return w;
    }
    // The loss tokens whose weight is non-zero, as a call of their own (no
    // global normalizers).
    static Data component(const Data &d, const std::vector<double> &w) {
        Data c;
        c.n = d.n;
        c.cu = d.cu;
        c.mask.assign(static_cast<size_t>(d.n), 0.0);
        for (int64_t t = 0; t < d.n; ++t) c.mask[t] = d.mask[t] != 0 && w[t] != 0 ? 1.0 : 0.0;
        c.finalize();
        return c;
    }

    Region region_;
    double mask_low_ = 0, mask_high_ = 0, adv_tau_, kl_tau_, ref_kl_mask_low_, ref_kl_tau_;
    double teacher_tau_ = 0;
    std::optional<double> ratio_clip_;
};

class Dppo : public PrimeRlLoss {
public:
    explicit Dppo(Params &p) : PrimeRlLoss(p, Region::BinaryTv) {}
};

} // namespace rl::losses
