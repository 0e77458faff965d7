// rl/sdk/rejection.hpp: AReaL's rejection sampling of off-policy tokens (its
// RejectionSamplingConfig / apply_rejection_sampling), one implementation for
// the decoupled_ppo loss and for the `rejection_sampling` option every policy
// loss has (pg_loss.hpp). Header-only, C++17, SDK only.
//
// For a target policy (logprobs `target`) and the behaviour policy that drew
// the tokens (`behav`), per loss token log r_t = target_t - behav_t. A token
// (level "token") or a whole sequence (level "sequence", its tokens' metric
// aggregated by sum / mean / max) whose metric (the ratio r, or the KL
// estimators k1 = log r, k2 = (log r)^2 / 2, k3 = exp(-log r) - 1 + log r) is
// outside [lower, upper] is masked (action "mask": weight 0) or its importance
// weight is truncated into [lower, upper] (action "clamp", metric ratio). At
// sequence level with the ratio metric the sum / mean / max aggregate log r
// (a product / geometric mean / max of ratios) and the weight of every token
// is the sequence's geometric-mean ratio. Formulas: docs/losses.md.
#pragma once

#include "loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace rl::sdk::loss {

struct RejectionSampling {
    enum class Metric { Ratio, K1, K2, K3 };
    enum class Agg { Sum, Mean, Max };
    bool sequence = false; // level
    bool clamp = false;    // action: clamp (truncate) instead of mask (reject)
    Metric metric = Metric::Ratio;
    Agg agg = Agg::Mean;
    double upper = 5.0;
    std::optional<double> lower;

    bool in_bounds(double m) const { return m <= upper && (!lower || m >= *lower); }

    // The object under parameter `key` of `outer`.
    static RejectionSampling read(Params &outer, const char *key = "rejection_sampling") {
        const rl::sdk::json raw = outer.raw(key);
        if (!raw.is_object())
            invalid(outer.owner() + ": parameter '" + key +
                    "' must be an object {level, action, metric, agg, upper, lower} (or null "
                    "for off), got " +
                    raw.dump());
        Params p(raw.dump(), outer.owner() + ": parameter '" + key + "'");
        RejectionSampling rs;
        rs.sequence = p.choice("level", "token", {"token", "sequence"}) == "sequence";
        rs.clamp = p.choice("action", "mask", {"mask", "clamp"}) == "clamp";
        const std::string m = p.choice("metric", "ratio", {"ratio", "kl_k1", "kl_k2", "kl_k3"});
        rs.metric = m == "ratio"   ? Metric::Ratio
                    : m == "kl_k1" ? Metric::K1
                    : m == "kl_k2" ? Metric::K2
                                   : Metric::K3;
        const bool agg_given = p.has("agg");
        const std::string a = p.choice("agg", "mean", {"sum", "mean", "max"});
        rs.agg = a == "sum" ? Agg::Sum : a == "mean" ? Agg::Mean : Agg::Max;
        if (agg_given && !rs.sequence)
            invalid(p.owner() + ": 'agg' only applies to level 'sequence'");
        rs.upper = p.number("upper", 5.0);
        rs.lower = p.optional_number("lower");
        p.finish();
        if (rs.lower && *rs.lower > rs.upper)
            invalid(p.owner() + ": 'lower' (" + num(*rs.lower) + ") must be <= 'upper' (" +
                    num(rs.upper) + ")");
        if (rs.metric == Metric::Ratio) {
            if (rs.upper <= 1.0)
                invalid(p.owner() + ": 'upper' must be > 1 for metric 'ratio', got " +
                        num(rs.upper));
            if (rs.lower && *rs.lower <= 0)
                invalid(p.owner() + ": 'lower' must be > 0 for metric 'ratio', got " +
                        num(*rs.lower));
        } else if (rs.metric != Metric::K1 && rs.upper <= 0) {
            invalid(p.owner() + ": 'upper' must be > 0 for metric '" + m + "', got " +
                    num(rs.upper));
        }
        if (rs.clamp && rs.metric != Metric::Ratio)
            invalid(p.owner() + ": action 'clamp' needs metric 'ratio' (it truncates the "
                                "importance weight); use action 'mask' with a KL metric");
        return rs;
    }

    // Per-token metric of log r.
    double token_metric(double lr) const {
        switch (metric) {
            case Metric::Ratio:
                return std::exp(lr);
            case Metric::K1:
                return lr;
            case Metric::K2:
                return 0.5 * lr * lr;
            default:
                return std::exp(-lr) - 1.0 + lr;
        }
    }

    // On the loss tokens of `d`: `bw` holds each token's importance weight
    // (the caller's, e.g. exp(target - behav)); rejection masks tokens (keep 0,
    // bw 0) or truncates bw. At sequence level with the ratio metric bw becomes
    // the sequence's geometric-mean ratio first. Returns how many tokens were
    // masked or had their weight changed.
    int64_t apply(const Data &d, const std::vector<double> &target,
                  const std::vector<double> &behav, std::vector<double> &bw,
                  std::vector<uint8_t> &keep) const {
        const double lo = lower.value_or(0.0);
        int64_t n = 0;
        auto act = [&](int64_t t) {
            if (clamp) {
                const double w = std::clamp(bw[t], lo, upper);
                n += w != bw[t];
                bw[t] = w;
            } else {
                keep[t] = 0;
                bw[t] = 0;
                ++n;
            }
        };
        if (!sequence) {
            for (int64_t t = 0; t < d.n; ++t)
                if (d.mask[t] != 0 && (clamp || !in_bounds(token_metric(target[t] - behav[t]))))
                    act(t);
            return n;
        }
        const bool log_agg = metric == Metric::Ratio;
        for (int64_t s = 0; s < d.n_seqs(); ++s) {
            const int64_t k = d.seq_tokens[s];
            if (!k) continue;
            double sum = 0, mx = -std::numeric_limits<double>::infinity(), sum_lr = 0;
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t) {
                if (d.mask[t] == 0) continue;
                const double lr = target[t] - behav[t];
                const double v = log_agg ? lr : token_metric(lr);
                sum += v;
                mx = std::max(mx, v);
                sum_lr += lr;
            }
            double a = agg == Agg::Sum ? sum : agg == Agg::Mean ? sum / double(k) : mx;
            if (log_agg) {
                a = std::exp(a);
                const double geo = std::exp(sum_lr / double(k));
                for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
                    if (d.mask[t] != 0) bw[t] = geo;
            }
            if (in_bounds(a)) continue;
            for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
                if (d.mask[t] != 0) act(t);
        }
        return n;
    }

    // The metric name of what apply() counts.
    const char *frac_metric() const { return clamp ? "behav_truncfrac" : "behav_maskfrac"; }
};

} // namespace rl::sdk::loss
