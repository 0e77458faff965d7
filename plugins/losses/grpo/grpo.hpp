// grpo: Surogate's GRPO loss (token-level AIPO, prime-rl's masked importance
// sampling of Dec 2025). A detached coefficient weights logprobs on the tokens
// that survive the token / geometric / sequence masks:
//   coeff_t = ratio * (adv_tau * A_t + teacher_tau * (teacher_t - lp_t) - kl_tau * log_ratio_t)
//   l_t = -sg(coeff_t) * lp_t on kept tokens, 0 on masked ones.
// Formulas, masks and metrics: docs/losses.md.
#pragma once

#include <rl/sdk/pg_loss.hpp>

namespace rl::losses {

using namespace rl::sdk::loss;

class GrpoLoss : public PolicyGradientLoss {
public:
    explicit GrpoLoss(Params &p) {
        sequence_ratio_ = p.choice("ratio_type", "token", {"token", "sequence"}) == "sequence";
        adv_tau_ = p.number("adv_tau", 1.0, 0.0);
        teacher_tau_ = p.number("teacher_tau", 0.0, 0.0);
        kl_tau_ = p.number("kl_tau", 0.0, 0.0);
        token_mask_low_ = p.number("token_mask_low", 0.125, 0.0);
        token_mask_high_ = p.number("token_mask_high", 8.0, 0.0);
        geo_mask_low_ = p.number("geo_mask_low", 0.1, 0.0);
        geo_mask_high_ = p.number("geo_mask_high", 10.0, 0.0);
        sequence_mask_low_ = p.number("sequence_mask_low", 0.0, 0.0);
        sequence_mask_high_ = p.number("sequence_mask_high", 100.0, 0.0);
        sequence_clip_high_ = p.number("sequence_clip_high", 10.0, 0.0);
        if (sequence_clip_high_ <= 0)
            invalid(p.owner() + ": parameter 'sequence_clip_high' must be > 0");
        check_order(p, "token_mask_low", token_mask_low_, "token_mask_high", token_mask_high_);
        check_order(p, "geo_mask_low", geo_mask_low_, "geo_mask_high", geo_mask_high_);
        check_order(p, "sequence_mask_low", sequence_mask_low_, "sequence_mask_high",
                    sequence_mask_high_);
        read_shared(p);
        report_valid_tokens_ = false; // grpo reports `tokens`
    }

    void add_inputs(LossSignature &s) const override {
        (teacher_tau_ != 0 ? s.required : s.optional).push_back("teacher_logprobs");
    }

    void policy(PgCall &c) const override {
        const Data &d = c.d;
        const auto &w = c.w;
        const auto &lp = c.lp;
        const auto &lp_sg = c.lp_sg;
        const auto &old = c.old;
        const auto &adv = c.adv;
        const auto *teacher = d.find("teacher_logprobs");
        auto &g = c.g;

        // Sequence-level quantities over each sequence's loss tokens (all detached).
        const int64_t S = d.n_seqs();
        std::vector<double> seq_ratio(S, 1.0);
        std::vector<char> seq_masked(S, 0);
        int64_t masked_seqs = 0;
        for (int64_t s = 0; s < S; ++s) {
            if (d.seq_tokens[s] == 0) continue;
            double sum = 0, mn = std::numeric_limits<double>::infinity(), mx = -mn;
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t) {
                if (d.mask[t] == 0) continue;
                const double lr = lp_sg[t] - old[t];
                sum += lr;
                mn = std::min(mn, std::exp(lr));
                mx = std::max(mx, std::exp(lr));
            }
            const double geo = std::exp(sum / double(d.seq_tokens[s]));
            seq_ratio[s] = std::min(std::exp(sum), sequence_clip_high_);
            seq_masked[s] = geo < geo_mask_low_ || geo > geo_mask_high_ ||
                            mn < sequence_mask_low_ || mx > sequence_mask_high_;
            if (seq_masked[s]) ++masked_seqs;
        }

        Stat kl, teacher_kl;
        int64_t masked = 0;
        double &pg = c.pg;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double lr = lp_sg[t] - old[t];
            const double ratio_t = std::exp(lr);
            kl.add(ratio_t - lr - 1.0);
            if (teacher) teacher_kl.add((*teacher)[t] - lp_sg[t]);
            const bool is_masked =
                ratio_t < token_mask_low_ || ratio_t > token_mask_high_ || seq_masked[d.seq[t]];
            if (is_masked) {
                ++masked;
                c.put("mask", t, 1.0);
                continue;
            }
            const double ratio = sequence_ratio_ ? seq_ratio[d.seq[t]] : ratio_t;
            double a = adv_tau_ * adv[t] - kl_tau_ * lr;
            if (teacher) a += teacher_tau_ * ((*teacher)[t] - lp_sg[t]);
            const double coeff = ratio * a;
            pg += -w[t] * coeff * lp[t];
            g[t] += -w[t] * coeff;
            c.put("elementwise_loss", t, -coeff * lp[t]);
            c.put("coeff", t, coeff);
        }
        kl.emit_mean(c.r, metrics::kKl);
        c.token_frac(metrics::kMasked, masked);
        c.r.seq_mean(metrics::kMaskedSeqs, frac(masked_seqs, d.loss_seqs), d.loss_seqs);
        c.r.sum(metrics::kTokens, double(d.loss_tokens));
        if (teacher) teacher_kl.emit_mean(c.r, metrics::kTeacherKl);
    }

private:
    bool sequence_ratio_;
    double adv_tau_, teacher_tau_, kl_tau_;
    double token_mask_low_, token_mask_high_, geo_mask_low_, geo_mask_high_;
    double sequence_mask_low_, sequence_mask_high_, sequence_clip_high_;
};

} // namespace rl::losses
