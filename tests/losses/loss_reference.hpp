// tests/losses/loss_reference.hpp: every loss and its metrics written directly
// from the formulas in docs/losses.md, independently of the plugin code (no
// shared helpers): per-sequence loops, the aggregation modes as their
// textbook formulas, parameters read straight from the JSON.
#pragma once

#include "loss_test_util.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace rl::losses::test {

struct RefResult {
    double loss = 0;
    std::map<std::string, double> metrics;
};

namespace ref {

using json = nlohmann::json;

inline double num_or(const json &p, const char *k, double def) {
    return p.contains(k) && !p[k].is_null() ? p[k].get<double>() : def;
}
inline bool has(const json &p, const char *k) {
    return p.contains(k) && !p[k].is_null();
}

// Loss tokens: loss_mask (if given) and, for cross-entropy, labels != ignore_index.
inline std::vector<bool> loss_tokens(const Batch &b, bool use_labels, int64_t ignore = -100) {
    std::vector<bool> m(b.n(), true);
    for (int64_t t = 0; t < b.n(); ++t) {
        if (b.f.count("loss_mask") && b["loss_mask"][t] == 0) m[t] = false;
        if (use_labels && b.labels[t] == ignore) m[t] = false;
    }
    return m;
}

// The aggregation modes as formulas over per-sequence token lists.
inline double aggregate(const Batch &b, const std::vector<bool> &m, const std::vector<double> &l,
                        const json &p, const char *def_mode = "token-mean") {
    const std::string mode = p.value("loss_agg_mode", std::string(def_mode));
    double total = 0;
    int64_t tokens = 0;
    std::vector<double> seq_sum, seq_n;
    for (int64_t s = 0; s < b.n_seqs(); ++s) {
        double sum = 0;
        int64_t k = 0;
        for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t)
            if (m[t]) {
                sum += l[t] * (b.f.count("weights") ? b["weights"][t] : 1.0); // input "weights"
                ++k;
            }
        total += sum;
        tokens += k;
        if (k) {
            seq_sum.push_back(sum);
            seq_n.push_back(double(k));
        }
    }
    const double T = b.global_tokens > 0 ? b.global_tokens : double(tokens);
    const double S = b.global_seqs > 0 ? b.global_seqs : double(seq_sum.size());
    if (mode == "sum") return total;
    if (mode == "token-mean") return T > 0 ? total / T : 0.0;
    if (S == 0) return 0.0;
    double acc = 0;
    for (size_t i = 0; i < seq_sum.size(); ++i)
        acc += mode == "seq-mean-token-mean" ? seq_sum[i] / seq_n[i] : seq_sum[i];
    if (mode == "seq-mean-token-sum-norm") return acc / (S * p.at("max_seq_len").get<double>());
    return acc / S; // seq-mean-token-sum, seq-mean-token-mean
}

// The values of a quantity over loss tokens (or sequences).
struct Mean {
    std::vector<double> xs;
    void add(double x) { xs.push_back(x); }
    double n() const { return double(xs.size()); }
    double mean(double empty = 0) const {
        return xs.empty() ? empty : std::accumulate(xs.begin(), xs.end(), 0.0) / n();
    }
};

// <name>_mean, <name>_min and <name>_max of ratios (1 when there is none).
inline void ratio_metrics(RefResult &out, const std::string &name, const Mean &r) {
    const bool none = r.xs.empty();
    out.metrics[name + "_mean"] = r.mean(1);
    out.metrics[name + "_min"] = none ? 1 : *std::min_element(r.xs.begin(), r.xs.end());
    out.metrics[name + "_max"] = none ? 1 : *std::max_element(r.xs.begin(), r.xs.end());
}

// z_loss * logsumexp^2 per loss token, and the z_loss metric (its mean).
inline void z_loss(const Batch &b, const std::vector<bool> &m, const json &p,
                   std::vector<double> &l, RefResult &out) {
    if (!has(p, "z_loss") || p["z_loss"].get<double>() == 0) return;
    const double z = p["z_loss"].get<double>();
    Mean s;
    for (int64_t t = 0; t < b.n(); ++t) {
        if (!m[t]) continue;
        const double x = b["logsumexp"][t];
        s.add(x * x);
        l[t] += z * x * x;
    }
    out.metrics["z_loss"] = s.mean();
}

// kl_coef * k(lp, ref) - entropy_coef * entropy, and the ref_kl / entropy metrics.
inline std::vector<double> regularizers(const Batch &b, const std::vector<bool> &m, const json &p,
                                        RefResult &out) {
    std::vector<double> l(b.n(), 0.0);
    const double kc = num_or(p, "kl_coef", 0), ec = num_or(p, "entropy_coef", 0);
    std::string kt = p.value("kl_type", std::string("k3"));
    if (!kt.empty() && kt.back() == '+') kt.pop_back(); // straight-through: the value is k's
    if (b.f.count("ref_logprobs")) {
        Mean k;
        for (int64_t t = 0; t < b.n(); ++t) {
            if (!m[t]) continue;
            const double lr = b["logprobs"][t] - b["ref_logprobs"][t];
            const double v = kt == "k1"    ? lr
                             : kt == "k2"  ? 0.5 * lr * lr
                             : kt == "abs" ? std::fabs(lr)
                                           : std::exp(-lr) + lr - 1;
            k.add(v);
            l[t] += kc * v;
        }
        out.metrics["ref_kl"] = k.mean();
    }
    if (b.f.count("entropy")) {
        Mean e;
        for (int64_t t = 0; t < b.n(); ++t) {
            if (!m[t]) continue;
            e.add(b["entropy"][t]);
            l[t] -= ec * b["entropy"][t];
        }
        out.metrics["entropy"] = e.mean();
    }
    z_loss(b, m, p, l, out);
    return l;
}

inline double clip(double x, double lo, double hi) {
    return std::min(std::max(x, lo), hi);
}
inline double frac(double k, double n) {
    return n ? k / n : 0.0;
}

// What every policy loss has: its loss tokens m, their count n, the
// regularizer terms per token l (their metrics in out) and the policy term per
// token pg_tok, which the loss adds into l.
struct PolicyFrame {
    RefResult out;
    std::vector<bool> m;
    std::vector<double> l, pg_tok;
    double n = 0;
    PolicyFrame(const Batch &b, const json &p)
        : m(loss_tokens(b, false)), l(regularizers(b, m, p, out)), pg_tok(b.n(), 0.0) {}
    // f(t) on every loss token t in [begin, end) (default: all), counted in n.
    template <class F>
    void each_token(F &&f, int64_t begin = 0, int64_t end = -1) {
        for (int64_t t = begin; t < (end < 0 ? int64_t(m.size()) : end); ++t)
            if (m[t]) {
                n += 1;
                f(t);
            }
    }
    // The loss and pg_loss, aggregated with `def_mode` unless loss_agg_mode is
    // given, and the token count as `tokens`.
    RefResult result(const Batch &b, const json &p, const char *def_mode = "token-mean",
                     const char *tokens = "valid_tokens") {
        out.loss = aggregate(b, m, l, p, def_mode);
        out.metrics["pg_loss"] = aggregate(b, m, pg_tok, p, def_mode);
        out.metrics[tokens] = n;
        return out;
    }
};

inline RefResult cross_entropy(const Batch &b, const json &p) {
    RefResult out;
    const auto m = loss_tokens(b, true, p.value("ignore_index", int64_t(-100)));
    std::vector<double> l(b.n(), 0.0);
    Mean nll;
    for (int64_t t = 0; t < b.n(); ++t)
        if (m[t]) {
            l[t] = -b["logprobs"][t];
            nll.add(l[t]);
        }
    z_loss(b, m, p, l, out);
    out.loss = aggregate(b, m, l, p);
    out.metrics["valid_tokens"] = nll.n();
    out.metrics["perplexity"] = std::exp(nll.mean());
    return out;
}

inline RefResult policy_loss(const Batch &b, const json &p) {
    PolicyFrame f(b, p);
    const double eps = num_or(p, "eps_clip", 0.2), eps_hi = num_or(p, "eps_clip_high", 0.2);
    const bool tis = p.value("use_tis", false), stats = p.value("compute_kl_stats", false);
    const double tis_lo = num_or(p, "tis_clip_low", 0.1), tis_hi = num_or(p, "tis_clip_high", 2.0);
    double clipped = 0, ice = 0, tis_clipped = 0;
    Mean ratio, k3, old_nll, tis_w;
    f.each_token([&](int64_t t) {
        const double A = b["advantages"][t];
        const double lr = b["logprobs"][t] - b["old_logprobs"][t], r = std::exp(lr);
        ratio.add(r);
        k3.add(r - lr - 1);
        old_nll.add(-b["old_logprobs"][t]);
        double v = std::max(-A * r, -A * clip(r, 1 - eps, 1 + eps_hi));
        bool c = -A * clip(r, 1 - eps, 1 + eps_hi) > -A * r;
        if (has(p, "eps_clip_c") && A < 0) {
            const double cap = -A * p["eps_clip_c"].get<double>();
            if (cap < v) c = true;
            v = std::min(v, cap);
        }
        clipped += c;
        if (has(p, "icepop_beta")) {
            const double beta = p["icepop_beta"].get<double>();
            if (r < 1 / beta || r > beta) {
                v = 0;
                ice += 1;
            }
        }
        if (tis) {
            const double raw = std::exp(b["logprobs"][t] - b["rollout_logprobs"][t]);
            tis_w.add(raw);
            const double w = clip(raw, tis_lo, tis_hi);
            tis_clipped += (w != raw);
            v *= w;
        }
        f.pg_tok[t] = v;
        f.l[t] += v;
    });
    RefResult &out = f.out;
    out.metrics["pg_clipfrac"] = frac(clipped, f.n);
    if (has(p, "icepop_beta")) out.metrics["icepop_maskfrac"] = frac(ice, f.n);
    if (tis) {
        ratio_metrics(out, "tis", tis_w);
        out.metrics["tis_clipfrac"] = frac(tis_clipped, f.n);
    }
    if (stats) {
        out.metrics["kl_sample_train_k3"] = k3.mean();
        out.metrics["entropy_sample"] = old_nll.mean();
        ratio_metrics(out, "ratio", ratio);
    }
    return f.result(b, p);
}

// importance_sampling and cispo share the ratio statistics.
inline RefResult importance_or_cispo(const Batch &b, const json &p, bool cispo) {
    PolicyFrame f(b, p);
    const double lo = num_or(p, "clip_low", 0.0), hi = num_or(p, "clip_high", 4.0);
    Mean ratio, k3, old_nll;
    double clipped = 0;
    f.each_token([&](int64_t t) {
        const double A = b["advantages"][t], lp = b["logprobs"][t];
        const double lr = lp - b["old_logprobs"][t], r = std::exp(lr);
        ratio.add(r);
        k3.add(r - lr - 1);
        old_nll.add(-b["old_logprobs"][t]);
        if (cispo) {
            const double c = clip(r, lo, hi);
            clipped += (c != r);
            f.pg_tok[t] = -c * A * lp;
        } else {
            f.pg_tok[t] = -r * A;
        }
        f.l[t] += f.pg_tok[t];
    });
    ratio_metrics(f.out, "ratio", ratio);
    if (cispo) f.out.metrics["clip_fraction"] = frac(clipped, f.n);
    if (p.value("compute_kl_stats", false)) {
        f.out.metrics["kl_sample_train_k3"] = k3.mean();
        f.out.metrics["entropy_sample"] = old_nll.mean();
    }
    return f.result(b, p);
}

inline RefResult grpo(const Batch &b, const json &p) {
    PolicyFrame f(b, p);
    const bool seq_type = p.value("ratio_type", std::string("token")) == "sequence";
    const double adv_tau = num_or(p, "adv_tau", 1), teacher_tau = num_or(p, "teacher_tau", 0),
                 kl_tau = num_or(p, "kl_tau", 0);
    const double tlo = num_or(p, "token_mask_low", 0.125), thi = num_or(p, "token_mask_high", 8);
    const double glo = num_or(p, "geo_mask_low", 0.1), ghi = num_or(p, "geo_mask_high", 10);
    const double slo = num_or(p, "sequence_mask_low", 0),
                 shi = num_or(p, "sequence_mask_high", 100);
    const double sclip = num_or(p, "sequence_clip_high", 10);
    const bool teacher = b.f.count("teacher_logprobs") != 0;
    double masked = 0, seqs = 0, masked_seqs = 0;
    Mean kl, tkl;
    for (int64_t s = 0; s < b.n_seqs(); ++s) {
        std::vector<int64_t> toks;
        for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t)
            if (f.m[t]) toks.push_back(t);
        if (toks.empty()) continue;
        seqs += 1;
        double log_sum = 0, rmin = 1e300, rmax = -1e300;
        for (auto t : toks) {
            const double lr = b["logprobs"][t] - b["old_logprobs"][t];
            log_sum += lr;
            rmin = std::min(rmin, std::exp(lr));
            rmax = std::max(rmax, std::exp(lr));
        }
        const double geo = std::exp(log_sum / double(toks.size()));
        const bool drop_seq = geo < glo || geo > ghi || rmin < slo || rmax > shi;
        masked_seqs += drop_seq;
        const double seq_ratio = std::min(std::exp(log_sum), sclip);
        for (auto t : toks) {
            f.n += 1;
            const double lp = b["logprobs"][t], lr = lp - b["old_logprobs"][t], r = std::exp(lr);
            kl.add(r - lr - 1);
            if (teacher) tkl.add(b["teacher_logprobs"][t] - lp);
            if (drop_seq || r < tlo || r > thi) {
                masked += 1;
                continue;
            }
            double a = adv_tau * b["advantages"][t] - kl_tau * lr;
            if (teacher) a += teacher_tau * (b["teacher_logprobs"][t] - lp);
            f.pg_tok[t] = -(seq_type ? seq_ratio : r) * a * lp;
            f.l[t] += f.pg_tok[t];
        }
    }
    f.out.metrics["kl"] = kl.mean();
    f.out.metrics["masked"] = frac(masked, f.n);
    f.out.metrics["masked_seqs"] = frac(masked_seqs, seqs);
    if (teacher) f.out.metrics["teacher_kl"] = tkl.mean();
    return f.result(b, p, "token-mean", "tokens");
}

inline RefResult decoupled_ppo(const Batch &b, const json &p) {
    PolicyFrame f(b, p);
    const double eps = num_or(p, "eps_clip", 0.2), eps_hi = num_or(p, "eps_clip_higher", eps);
    double clipped = 0, dual = 0, capped = 0;
    Mean ratio, akl, bw, bkl;
    // Token-level rejection: the object, or AReaL's older cap / mode.
    struct {
        bool on = false, clamp = false, has_lower = false;
        std::string metric = "ratio";
        double upper = 5, lower = 0;
    } rs;
    const std::string mode = p.value("behav_imp_weight_mode", std::string("token_mask"));
    const bool disabled = mode == "disabled";
    if (has(p, "rejection_sampling")) {
        const json &o = p["rejection_sampling"];
        rs.on = true;
        rs.clamp = o.value("action", std::string("mask")) == "clamp";
        rs.metric = o.value("metric", std::string("ratio"));
        rs.upper = num_or(o, "upper", 5.0);
        rs.has_lower = has(o, "lower");
        rs.lower = num_or(o, "lower", 0.0);
    } else if (has(p, "behav_imp_weight_cap")) {
        rs.on = true;
        rs.clamp = mode == "token_truncate";
        rs.upper = p["behav_imp_weight_cap"].get<double>();
        rs.has_lower = rs.clamp; // truncation clamps into [0, cap]
    }
    f.each_token([&](int64_t t) {
        const double A = b["advantages"][t];
        const double lr = b["logprobs"][t] - b["prox_logprobs"][t], r = std::exp(lr);
        ratio.add(r);
        akl.add(lr);
        const double l1 = -A * r, l2 = -A * clip(r, 1 - eps, 1 + eps_hi);
        double v = std::max(l1, l2);
        clipped += (l2 > l1);
        if (has(p, "c_clip") && A < 0 && -A * p["c_clip"].get<double>() < v) {
            v = -A * p["c_clip"].get<double>();
            dual += 1;
        }
        const double blr = b["prox_logprobs"][t] - b["old_logprobs"][t];
        double w = disabled ? 1.0 : std::exp(blr);
        if (rs.on) {
            const double v = rs.metric == "ratio"   ? std::exp(blr)
                             : rs.metric == "kl_k1" ? blr
                             : rs.metric == "kl_k2" ? 0.5 * blr * blr
                                                    : std::exp(-blr) - 1 + blr;
            const bool in = v <= rs.upper && (!rs.has_lower || v >= rs.lower);
            if (rs.clamp) {
                const double c = clip(w, rs.has_lower ? rs.lower : 0.0, rs.upper);
                capped += (c != w);
                w = c;
            } else if (!in) {
                capped += 1;
                return;
            }
        }
        bw.add(w);
        bkl.add(b["prox_logprobs"][t] - b["old_logprobs"][t]);
        f.pg_tok[t] = w * v;
        f.l[t] += f.pg_tok[t];
    });
    RefResult &out = f.out;
    out.metrics["pg_clipfrac"] = frac(clipped, f.n);
    if (has(p, "c_clip")) out.metrics["dual_clipfrac"] = frac(dual, f.n);
    out.metrics["ratio_mean"] = ratio.mean(1);
    out.metrics["approx_kl"] = akl.mean();
    out.metrics["behav_imp_weight"] = bw.mean(1);
    out.metrics["behav_approx_kl"] = bkl.mean();
    if (rs.on) out.metrics[rs.clamp ? "behav_truncfrac" : "behav_maskfrac"] = frac(capped, f.n);
    return f.result(b, p);
}

// The end of a sequence-ratio loss (gspo, gmpo): loss and pg_loss under
// seq-mean-token-mean by default, the clip fraction and the sequence ratios.
inline RefResult sequence_loss_result(const Batch &b, const json &p, PolicyFrame &f, double clipped,
                                      const Mean &sr) {
    f.out.metrics["pg_clipfrac"] = frac(clipped, f.n);
    ratio_metrics(f.out, "seq_ratio", sr);
    return f.result(b, p, "seq-mean-token-mean");
}

inline RefResult gspo(const Batch &b, const json &p) {
    PolicyFrame f(b, p);
    const double eps = num_or(p, "eps_clip", 3e-4), eps_hi = num_or(p, "eps_clip_high", 4e-4);
    double clipped = 0;
    Mean sr;
    for (int64_t s = 0; s < b.n_seqs(); ++s) {
        double sum = 0, k = 0;
        for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t)
            if (f.m[t]) {
                sum += b["logprobs"][t] - b["old_logprobs"][t];
                k += 1;
            }
        if (!k) continue;
        const double si = std::exp(sum / k);
        sr.add(si);
        f.each_token(
            [&](int64_t t) {
                const double A = b["advantages"][t];
                const double l1 = -A * si, l2 = -A * clip(si, 1 - eps, 1 + eps_hi);
                clipped += (l2 > l1);
                f.pg_tok[t] = std::max(l1, l2);
                f.l[t] += f.pg_tok[t];
            },
            b.cu[s], b.cu[s + 1]);
    }
    return sequence_loss_result(b, p, f, clipped, sr);
}

inline RefResult value_loss(const Batch &b, const json &p) {
    RefResult out;
    const auto m = loss_tokens(b, false);
    const double coef = num_or(p, "vf_coef", 1.0);
    std::vector<double> l(b.n(), 0.0);
    double n = 0, clipped = 0, linear = 0;
    Mean v, ret, err;
    for (int64_t t = 0; t < b.n(); ++t) {
        if (!m[t]) continue;
        n += 1;
        const double e1 = b["values"][t] - b["returns"][t];
        double sq = e1 * e1;
        if (has(p, "vf_clip")) {
            const double c = p["vf_clip"].get<double>(), o = b["old_values"][t];
            const double e2 = clip(b["values"][t], o - c, o + c) - b["returns"][t];
            if (e2 * e2 > sq) clipped += 1;
            sq = std::max(sq, e2 * e2);
        }
        l[t] = 0.5 * coef * sq;
        if (has(p, "huber_delta")) {
            const double delta = p["huber_delta"].get<double>(), a = std::sqrt(sq);
            if (a > delta) {
                l[t] = coef * delta * (a - 0.5 * delta);
                linear += 1;
            }
        }
        v.add(b["values"][t]);
        ret.add(b["returns"][t]);
        err.add(e1 * e1);
    }
    out.loss = aggregate(b, m, l, p);
    out.metrics["value_mean"] = v.mean();
    out.metrics["return_mean"] = ret.mean();
    out.metrics["value_error_sq_mean"] = err.mean();
    if (has(p, "vf_clip")) out.metrics["vf_clipfrac"] = frac(clipped, n);
    if (has(p, "huber_delta")) out.metrics["huber_linear_frac"] = frac(linear, n);
    out.metrics["valid_tokens"] = n;
    return out;
}

inline RefResult sapo(const Batch &b, const json &p) {
    PolicyFrame f(b, p);
    const double tp = num_or(p, "tau_pos", 1.0), tn = num_or(p, "tau_neg", 1.05);
    Mean gate, ratio;
    if (p.value("importance_sampling_level", std::string("token")) == "sequence") {
        // AReaL's sequence level: the gate of the geometric-mean ratio, times the
        // sequence's mean advantage, on each of its loss tokens.
        for (int64_t s = 0; s < b.n_seqs(); ++s) {
            double lr = 0, a = 0, k = 0;
            for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t)
                if (f.m[t]) {
                    lr += b["logprobs"][t] - b["old_logprobs"][t];
                    a += b["advantages"][t];
                    k += 1;
                }
            if (!k) continue;
            const double si = std::exp(lr / k), abar = a / k, tau = abar > 0 ? tp : tn;
            const double g = 4.0 / tau / (1.0 + std::exp(-tau * (si - 1.0)));
            f.each_token(
                [&](int64_t t) {
                    gate.add(g);
                    ratio.add(si);
                    f.pg_tok[t] = -g * abar;
                    f.l[t] += f.pg_tok[t];
                },
                b.cu[s], b.cu[s + 1]);
        }
        f.out.metrics["gate_mean"] = gate.mean();
        ratio_metrics(f.out, "ratio", ratio);
        return f.result(b, p, "seq-mean-token-mean");
    }
    f.each_token([&](int64_t t) {
        const double A = b["advantages"][t];
        const double r = std::exp(b["logprobs"][t] - b["old_logprobs"][t]);
        const double tau = A > 0 ? tp : tn;
        const double g = 4.0 / tau / (1.0 + std::exp(-tau * (r - 1.0)));
        gate.add(g);
        ratio.add(r);
        f.pg_tok[t] = -g * A;
        f.l[t] += f.pg_tok[t];
    });
    f.out.metrics["gate_mean"] = gate.mean();
    ratio_metrics(f.out, "ratio", ratio);
    return f.result(b, p, "seq-mean-token-mean");
}

inline RefResult gmpo(const Batch &b, const json &p) {
    PolicyFrame f(b, p);
    const double lo = num_or(p, "eps_clip", 0.4), hi = num_or(p, "eps_clip_high", 0.4);
    double clipped = 0;
    Mean sr;
    for (int64_t s = 0; s < b.n_seqs(); ++s) {
        double sum = 0, asum = 0, k = 0;
        for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t) {
            if (!f.m[t]) continue;
            const double A = b["advantages"][t], lr = b["logprobs"][t] - b["old_logprobs"][t];
            const double sgn = A > 0 ? 1.0 : A < 0 ? -1.0 : 0.0;
            // verl: sgn(A) * min(sgn(A) lr, sgn(A) clamp(lr)).
            const double chosen = sgn * std::min(sgn * lr, sgn * clip(lr, -lo, hi));
            clipped += (sgn != 0 && chosen != lr);
            sum += chosen;
            asum += A;
            k += 1;
        }
        if (!k) continue;
        const double si = std::exp(sum / k), abar = asum / k;
        sr.add(si);
        f.each_token(
            [&](int64_t t) {
                f.pg_tok[t] = -abar * si;
                f.l[t] += f.pg_tok[t];
            },
            b.cu[s], b.cu[s + 1]);
    }
    return sequence_loss_result(b, p, f, clipped, sr);
}

// cov_t = (A_t - mean A)(lp_t - mean lp) over loss tokens.
inline std::vector<double> covariance(const Batch &b, const std::vector<bool> &m) {
    Mean a, lp;
    for (int64_t t = 0; t < b.n(); ++t)
        if (m[t]) {
            a.add(b["advantages"][t]);
            lp.add(b["logprobs"][t]);
        }
    std::vector<double> cov(b.n(), 0.0);
    for (int64_t t = 0; t < b.n(); ++t)
        if (m[t]) cov[t] = (b["advantages"][t] - a.mean()) * (b["logprobs"][t] - lp.mean());
    return cov;
}

// The k tokens of `from` with the largest cov (ties: lower index), by repeated
// arg-max.
inline std::vector<bool> largest(std::vector<int64_t> from, const std::vector<double> &cov,
                                 double k, int64_t n) {
    std::vector<bool> pick(n, false);
    for (double i = 0; i < k && !from.empty(); ++i) {
        size_t best = 0;
        for (size_t j = 1; j < from.size(); ++j)
            if (cov[from[j]] > cov[from[best]]) best = j;
        pick[from[best]] = true;
        from.erase(from.begin() + long(best));
    }
    return pick;
}

inline RefResult clip_cov(const Batch &b, const json &p, const Data &sg) {
    PolicyFrame f(b, p);
    const double eps = num_or(p, "eps_clip", 0.2), eps_hi = num_or(p, "eps_clip_high", 0.2);
    const double lb = num_or(p, "clip_cov_lb", 1.0), ub = num_or(p, "clip_cov_ub", 5.0);
    const double ratio = num_or(p, "clip_cov_ratio", 2e-4);
    const auto cov = covariance(b, f.m);
    double clipped = 0;
    std::vector<int64_t> cand;
    f.each_token([&](int64_t t) {
        const double A = b["advantages"][t];
        const double r = std::exp(b["logprobs"][t] - b["old_logprobs"][t]);
        const bool c = -A * clip(r, 1 - eps, 1 + eps_hi) > -A * r;
        clipped += c;
        f.pg_tok[t] = std::max(-A * r, -A * clip(r, 1 - eps, 1 + eps_hi));
        if (!c && cov[t] > lb && cov[t] < ub) cand.push_back(t);
    });
    const double k = f.n ? std::max(std::floor(ratio * f.n), 1.0) : 0.0;
    std::vector<bool> drop(b.n(), false);
    if (p.value("selection", std::string("random")) == "top") {
        drop = largest(cand, cov, k, b.n());
    } else {
        // The pseudo-random draw itself is the plugin's (a fixed generator); its
        // properties are tested in loss_behaviour_test.cpp.
        for (int64_t t :
             rl::losses::select_random(cand, sg, p.value("seed", int64_t(0)), int64_t(k)))
            drop[t] = true;
    }
    double dropped = 0;
    for (int64_t t = 0; t < b.n(); ++t)
        if (drop[t]) {
            dropped += 1;
            f.pg_tok[t] = 0;
        }
    for (int64_t t = 0; t < b.n(); ++t) f.l[t] += f.pg_tok[t];
    f.out.metrics["pg_clipfrac"] = frac(clipped, f.n);
    f.out.metrics["cov_clipfrac"] = frac(dropped, f.n);
    f.out.metrics["cov_candidates"] = double(cand.size());
    return f.result(b, p);
}

inline RefResult kl_cov(const Batch &b, const json &p) {
    PolicyFrame f(b, p);
    const double ratio = num_or(p, "kl_cov_ratio", 2e-4), coef = num_or(p, "ppo_kl_coef", 0.1);
    const auto cov = covariance(b, f.m);
    std::vector<int64_t> all;
    f.each_token([&](int64_t t) { all.push_back(t); });
    const double k = f.n ? std::max(std::floor(ratio * f.n), 1.0) : 0.0;
    const auto pen = largest(all, cov, k, b.n());
    Mean abs_kl;
    double selected = 0;
    for (int64_t t : all) {
        const double lr = b["logprobs"][t] - b["old_logprobs"][t];
        f.pg_tok[t] = -b["advantages"][t] * std::exp(lr) + (pen[t] ? coef * std::fabs(lr) : 0.0);
        selected += pen[t];
        abs_kl.add(std::fabs(lr));
        f.l[t] += f.pg_tok[t];
    }
    f.out.metrics["kl_cov_frac"] = frac(selected, f.n);
    f.out.metrics["abs_kl"] = abs_kl.mean();
    return f.result(b, p);
}

} // namespace ref

// The loss value and metrics of `loss` with `params` on `b`, from the formulas;
// nullopt for a loss that has no reference here (it still gets every generic
// check: gradients, contract, C ABI parity).
inline std::optional<RefResult> reference(const std::string &loss, const Batch &b,
                                          const std::string &params) {
    const auto p = nlohmann::json::parse(params);
    // rejection_sampling on the other policy losses: hand-computed cases
    // (RejectionSampling.* in loss_behaviour_test.cpp).
    if (loss != "decoupled_ppo" && p.contains("rejection_sampling")) return std::nullopt;
    if (loss == "causallm_loss" || loss == "per_token_ce") return ref::cross_entropy(b, p);
    if (loss == "policy_loss") return ref::policy_loss(b, p);
    if (loss == "importance_sampling") return ref::importance_or_cispo(b, p, false);
    if (loss == "cispo") return ref::importance_or_cispo(b, p, true);
    if (loss == "grpo") return ref::grpo(b, p);
    if (loss == "decoupled_ppo") {
        // Token-level rejection sampling and AReaL's token modes are here; the
        // sequence levels are checked by hand-computed cases (DecoupledPpo.* in
        // loss_behaviour_test.cpp).
        const std::string mode = p.value("behav_imp_weight_mode", std::string("token_mask"));
        if (p.contains("behave_imp_weight_mode") || p.contains("behave_imp_weight_cap") ||
            p.contains("importance_sampling_level") || mode.rfind("sequence", 0) == 0 ||
            (p.contains("rejection_sampling") &&
             p["rejection_sampling"].value("level", std::string("token")) != "token"))
            return std::nullopt;
        return ref::decoupled_ppo(b, p);
    }
    if (loss == "gspo") return ref::gspo(b, p);
    if (loss == "value_loss") return ref::value_loss(b, p);
    if (loss == "sapo") return ref::sapo(b, p);
    if (loss == "gmpo") return ref::gmpo(b, p);
    if (loss == "kl_cov") return ref::kl_cov(b, p);
    if (loss == "clip_cov") {
        T::Host host;
        T::Instance<ClipCov> inst(host, params);
        return ref::clip_cov(b, p, prepare(inst.object(), b));
    }
    return std::nullopt;
}

} // namespace rl::losses::test
