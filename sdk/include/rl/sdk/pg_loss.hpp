// rl/sdk/pg_loss.hpp: the policy-gradient loss base, on top of rl/sdk/loss.hpp.
// Header-only, C++17, SDK only.
//
// A policy loss derives from PolicyGradientLoss, reads its own parameters,
// calls read_shared(p) (loss_agg_mode + max_seq_len, kl_coef / kl_type /
// entropy_coef) and implements policy(PgCall &): per loss token, add the
// policy term's weighted value and gradient. The base gives it
//   - the signature {logprobs, old_logprobs, advantages} + loss_mask and
//     rollout_is_weights (verl's precomputed per-token importance weights,
//     which multiply the policy term), the differentiable logprobs, ref_logprobs / entropy when the
//     regularizers need them, plus whatever add_inputs() declares;
//   - the aggregation weights, the inputs as vectors, the gradient buffer;
//   - the metrics pg_loss (first), valid_tokens and ref_kl / entropy (last), and
//     the KL / entropy terms added to the loss and its gradient;
//   - everything of LossBase (input, dtype and finiteness checks, gradients).
//
// A complete loss (REINFORCE with importance ratio, every loss_agg_mode):
//
//   struct Is : rl::sdk::loss::PolicyGradientLoss {
//       explicit Is(rl::sdk::Params &p) { read_shared(p); }
//       void policy(rl::sdk::loss::PgCall &c) const override {
//           for (int64_t t : c.tokens()) {
//               const double r = c.ratio(t);
//               c.add(t, -r * c.adv[t], -r * c.adv[t]);
//           }
//       }
//   };
//
// Also here: the PPO clip (with dual clip) as one function, parameter checks
// the policy losses share, sequence-level ratios, and the token selections of
// the Clip-Cov / KL-Cov losses.
#pragma once

#include "loss.hpp"
#include "rejection.hpp"
#include "utf8_rng.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rl::sdk::loss {

// ---- parameter checks -----------------------------------------------------------------

// eps_clip in [0, 1): the lower PPO bound is 1 - eps_clip.
inline double read_eps_clip(Params &p, double def, const char *key = "eps_clip") {
    const double v = p.number(key, def, 0.0, 1.0);
    if (v >= 1.0)
        invalid(p.owner() + ": parameter " + p.label(key) +
                " must be < 1 (the lower bound is 1 - " + key + ")");
    return v;
}

// ---- other frameworks' parameter names ------------------------------------------------
//
// docs/losses.md, "Parameter names of other frameworks": where a peer's knob
// means the same thing it is accepted under the peer's name; where it does
// not, it is refused with a message naming the equivalent here.

// The PPO clip bounds as verl, TRL, OpenRLHF, AReaL and xorl name them, for a
// loss whose own names are `low` (lower ratio bound 1 - low), `high` (upper
// bound 1 + high) and `dual` (dual-clip constant for A < 0; nullptr: the loss
// has none). verl's "clip_ratio" and TRL's "epsilon" set both bounds (the
// upper one unless it is given too), as they do there. Call before reading
// the bounds.
inline void accept_peer_clip_names(Params &p, const char *low, const char *high,
                                   const char *dual = nullptr) {
    struct Name {
        const char *key, *peer;
        int role; // 0: low, 1: high, 2: dual
    };
    static const Name names[] = {
        {"clip_ratio_low", "verl", 0},    {"clip_eps_low", "OpenRLHF", 0},
        {"eps_clip", "xorl", 0},          {"clip_ratio_high", "verl", 1},
        {"clip_eps_high", "OpenRLHF", 1}, {"epsilon_high", "TRL", 1},
        {"eps_clip_high", "xorl", 1},     {"eps_clip_higher", "AReaL", 1},
        {"clip_ratio_c", "verl", 2},      {"dual_clip", "OpenRLHF", 2},
        {"eps_clip_c", "xorl", 2},        {"c_clip", "AReaL", 2},
    };
    const char *own[] = {low, high, dual};
    for (const Name &n : names) {
        const char *target = own[n.role];
        if (target == nullptr || std::strcmp(n.key, target) == 0) continue;
        p.alias(n.key, target, n.peer);
    }
    p.alias("clip_ratio", low, "verl", {high});
    p.alias("epsilon", low, "TRL", {high});
}

// Every peer name of a PPO clip bound, for a loss that has no such bound:
// refused with `instead` (what to do here).
inline void refuse_peer_clip_names(Params &p, const std::string &instead) {
    static const char *const names[] = {
        "eps_clip",      "eps_clip_high",  "eps_clip_higher", "eps_clip_c",   "c_clip",
        "clip_ratio",    "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "clip_eps_low",
        "clip_eps_high", "dual_clip",      "epsilon",         "epsilon_high"};
    for (const char *n : names) p.refuse(n, instead);
}

// The PPO ratio bounds lo = 1 - eps_clip and hi = 1 + eps_clip_high of a loss
// with those two parameters, accepted under the peers' names too (`dual`: the
// loss's dual-clip parameter, which the loss reads itself; nullptr: none).
struct ClipBounds {
    double lo, hi;
};
inline ClipBounds read_clip_bounds(Params &p, double eps_clip, double eps_clip_high,
                                   const char *dual = nullptr) {
    accept_peer_clip_names(p, "eps_clip", "eps_clip_high", dual);
    const double low = read_eps_clip(p, eps_clip);
    return {1.0 - low, 1.0 + p.number("eps_clip_high", eps_clip_high, 0.0)};
}

// Refuses hi < lo, naming both parameters.
inline void check_order(Params &p, const char *lo_name, double lo, const char *hi_name, double hi) {
    if (hi < lo)
        invalid(p.owner() + ": parameter '" + hi_name + "' (" + num(hi) + ") must be >= '" +
                lo_name + "' (" + num(lo) + ")");
}

// Refuses v <= 0.
inline void check_positive(Params &p, const char *name, double v) {
    if (v <= 0) invalid(p.owner() + ": parameter '" + name + "' must be > 0, got " + num(v));
}

// An optional bound that must be > 1 (null or absent: off).
inline std::optional<double> read_optional_above_one(Params &p, const char *name) {
    const auto v = p.optional_number(name, 1.0);
    if (v && *v <= 1.0)
        invalid(p.owner() + ": parameter '" + name + "' must be > 1 (or null for off), got " +
                num(*v));
    return v;
}

// ---- PPO clip ------------------------------------------------------------------------------

// PPO's per-token surrogate max(-A r, -A clip(r, lo, hi)) and, with `dual`
// (dual clip, A < 0 only), min(that, -A dual). `loss` is its value, `dloss`
// its derivative in r times r (= d loss / d logprobs when r = exp(logprobs -
// old)): -A r on the unclipped branch, 0 on a clipped one.
struct PpoTerm {
    double loss = 0, dloss = 0;
    bool clipped = false;      // the clip(r) branch was taken
    bool dual_clipped = false; // the dual-clip branch was taken
};

inline PpoTerm ppo_clip(double A, double ratio, double lo, double hi,
                        std::optional<double> dual = std::nullopt) {
    PpoTerm p;
    const double l1 = -A * ratio, l2 = -A * std::clamp(ratio, lo, hi);
    p.loss = l1;
    p.dloss = -A * ratio;
    if (l2 > l1) {
        p.loss = l2;
        p.dloss = 0;
        p.clipped = true;
    }
    if (dual && A < 0) {
        const double l3 = -A * *dual;
        if (l3 < p.loss) {
            p.loss = l3;
            p.dloss = 0;
            p.dual_clipped = true;
        }
    }
    return p;
}

// ---- the policy-gradient base -----------------------------------------------------------

// One call of a policy loss: the inputs, the aggregation weights and the
// outputs being built.
struct PgCall {
    PgCall(const Data &live, const Data &detached, std::vector<double> weights)
        : d(live), sg(detached), w(std::move(weights)), lp(live.at("logprobs")),
          lp_sg(detached.at("logprobs")), old(live.at("old_logprobs")), adv(live.at("advantages")),
          g(r.g("logprobs", live.n)) {}

    const Data &d, &sg;          // live and detached views (see loss.hpp)
    const std::vector<double> w; // aggregation weight of each token
    const std::vector<double> &lp, &lp_sg, &old, &adv;
    Result r;               // loss, gradients, metrics
    std::vector<double> &g; // d loss / d logprobs
    double pg = 0;          // the policy term, reported as pg_loss
    // per_token_outputs: tensors the loss emits, [n_tokens], 0 off loss tokens.
    bool per_token = false;
    std::map<std::string, std::vector<double>> out;

    // Indices of the loss tokens, in order.
    std::vector<int64_t> tokens() const {
        std::vector<int64_t> v;
        for (int64_t t = 0; t < d.n; ++t)
            if (d.mask[t] != 0) v.push_back(t);
        return v;
    }
    double log_ratio(int64_t t) const { return lp[t] - old[t]; }
    double ratio(int64_t t) const { return std::exp(lp[t] - old[t]); }
    double log_ratio_sg(int64_t t) const { return lp_sg[t] - old[t]; }
    double ratio_sg(int64_t t) const { return std::exp(lp_sg[t] - old[t]); }
    // pg += w_t * l, g_t += w_t * dl (and the elementwise_loss output).
    void add(int64_t t, double l, double dl) {
        pg += w[t] * l;
        g[t] += w[t] * dl;
        put("elementwise_loss", t, l);
    }
    // Sets token t of the per-token output `name` (only with per_token_outputs).
    void put(const char *name, int64_t t, double v) {
        if (!per_token) return;
        auto &o = out[name];
        if (o.empty()) o.assign(static_cast<size_t>(d.n), 0.0);
        o[static_cast<size_t>(t)] = v;
    }
    void metric(const std::string &name, double v) { r.metric(name, v); }
    // k out of the call's loss tokens.
    double frac(int64_t k) const { return loss::frac(k, d.loss_tokens); }
    // The metric `name` = frac(k), a token mean over the call's loss tokens.
    void token_frac(const std::string &name, int64_t k) {
        r.token_mean(name, frac(k), d.loss_tokens);
    }
};

class PolicyGradientLoss : public LossBase {
public:
    LossSignature signature() const override {
        LossSignature s{{"logprobs", "old_logprobs", "advantages"},
                        {"loss_mask", "weights", "rollout_is_weights"},
                        {"logprobs"}};
        add_inputs(s);
        if (rs_) { // rollout_logprobs becomes required
            s.optional.erase(std::remove(s.optional.begin(), s.optional.end(), "rollout_logprobs"),
                             s.optional.end());
            if (std::find(s.required.begin(), s.required.end(), "rollout_logprobs") ==
                s.required.end())
                s.required.push_back("rollout_logprobs");
        }
        reg_.add_to(s);
        return s;
    }

    Result evaluate(const Data &d, const Data &sg) const final {
        const std::vector<double> w = agg_.weights(d);
        int64_t rejected = 0;
        const std::vector<double> rw = rejection_weights(d, rejected);
        PgCall c(d, sg, with_rollout_is_weights(d, with_factors(w, rw)));
        c.per_token = per_token_outputs_;
        if (rs_) {
            c.token_frac(rs_->frac_metric(), rejected);
            for (int64_t t = 0; t < d.n; ++t)
                if (d.mask[t] != 0) {
                    c.put("rejection_mask", t, rw[t] == 0 ? 1.0 : 0.0);
                    c.put("rejection_weight", t, rw[t]);
                }
        }
        policy(c);
        c.r.loss = c.pg;
        // Each call's loss is normalized by the whole step's counts: the step's
        // policy term is the sum over calls.
        c.r.metrics.insert(c.r.metrics.begin(), {metrics::kPgLoss, c.pg});
        c.r.reductions[metrics::kPgLoss] = {RL_METRIC_SUM, 0.0};
        if (report_valid_tokens_) c.r.sum(metrics::kValidTokens, double(d.loss_tokens));
        reg_.apply(d, sg, w, c.r);
        if (per_token_outputs_) {
            c.out.emplace("elementwise_loss", std::vector<double>(static_cast<size_t>(d.n), 0.0));
            if (const auto *ref = d.find("ref_logprobs")) {
                auto &k = c.out["kl"];
                k.assign(static_cast<size_t>(d.n), 0.0);
                for (int64_t t = 0; t < d.n; ++t)
                    if (d.mask[t] != 0)
                        k[t] = kl_value(reg_.kl_type.value, d.at("logprobs")[t], (*ref)[t]);
            }
            for (auto &kv : c.out) c.r.tensors.emplace_back(kv.first, std::move(kv.second));
        }
        return std::move(c.r);
    }

    // The `rejection_sampling` option (rejection.hpp) of old_logprobs (the
    // policy the loss corrects towards) against rollout_logprobs (the
    // behaviour policy that drew the tokens): per loss token 0 when masked, the
    // truncated importance weight under action clamp, else 1; empty when off.
    // `rejected` counts the masked or truncated tokens.
    std::vector<double> rejection_weights(const Data &d, int64_t &rejected) const {
        rejected = 0;
        if (!rs_) return {};
        const auto &old = d.at("old_logprobs");
        const auto &roll = d.at("rollout_logprobs");
        std::vector<double> bw(static_cast<size_t>(d.n), 0.0);
        std::vector<uint8_t> keep(static_cast<size_t>(d.n), 0);
        for (int64_t t = 0; t < d.n; ++t)
            if (d.mask[t] != 0) {
                bw[t] = std::exp(old[t] - roll[t]);
                keep[t] = 1;
            }
        rejected = rs_->apply(d, old, roll, bw, keep);
        if (!rs_->clamp)
            for (int64_t t = 0; t < d.n; ++t) bw[t] = keep[t] ? 1.0 : 0.0;
        return bw;
    }
    static std::vector<double> with_factors(std::vector<double> w, const std::vector<double> &f) {
        if (!f.empty())
            for (size_t t = 0; t < w.size(); ++t) w[t] *= f[t];
        return w;
    }

    // verl's rollout_is_weights: precomputed per-token importance weights
    // (>= 0, detached) that multiply the policy term of every token, not the
    // KL / entropy terms. Folded into the aggregation weights the policy term
    // is built with: every policy term is linear in its per-token weights.
    static std::vector<double> with_rollout_is_weights(const Data &d, std::vector<double> w) {
        const auto *is = d.find("rollout_is_weights");
        if (!is) return w;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            if ((*is)[t] < 0)
                invalid("input 'rollout_is_weights' must be >= 0, got " + num((*is)[t]) +
                        " at token " + std::to_string(t));
            w[t] *= (*is)[t];
        }
        return w;
    }

    // The policy term: add every loss token's weighted value to c.pg and its
    // gradient to c.g (c.add does both) and emit the loss's own metrics.
    virtual void policy(PgCall &c) const = 0;

protected:
    // loss_agg_mode (default `default_agg`) and the KL / entropy regularizers.
    // Call once, after reading the loss's own parameters.
    void read_shared(Params &p, const std::string &default_agg = "token-mean") {
        per_token_outputs_ = p.boolean("per_token_outputs", false);
        if (!own_rejection_sampling_ && p.has("rejection_sampling") &&
            !p.raw("rejection_sampling").is_null())
            rs_ = RejectionSampling::read(p);
        agg_ = Aggregation::read(p, default_agg);
        reg_.read(p);
    }
    // Inputs beyond the standard ones (e.g. rollout_logprobs for TIS).
    virtual void add_inputs(LossSignature &) const {}

    const Aggregation &aggregation() const { return agg_; }
    bool report_valid_tokens_ = true;
    // The loss reads `rejection_sampling` itself (decoupled_ppo); set before read_shared.
    bool own_rejection_sampling_ = false;

private:
    bool per_token_outputs_ = false;
    std::optional<RejectionSampling> rs_;
    Aggregation agg_;
    Regularizers reg_;
};

// ---- sequence-level quantities ---------------------------------------------------------

// exp(mean over the loss tokens of sequence s of (lp - old)); 1 when it has none.
inline double seq_geo_ratio(const Data &d, const std::vector<double> &lp,
                            const std::vector<double> &old, int64_t s) {
    const int64_t ni = d.seq_tokens[s];
    if (ni == 0) return 1.0;
    double sum = 0;
    for (int64_t t = d.cu[s]; t < d.cu[s + 1]; ++t)
        if (d.mask[t] != 0) sum += lp[t] - old[t];
    return std::exp(sum / double(ni));
}

// seq_ratio_mean / min / max of a loss's sequence-level ratios (1 when the
// call has no sequence with loss tokens).
inline void emit_seq_ratio(Result &r, const Stat &seq_ratio) {
    seq_ratio.emit_seq_mean(r, metrics::kSeqRatioMean, 1.0);
    seq_ratio.emit_min(r, metrics::kSeqRatioMin, 1.0);
    seq_ratio.emit_max(r, metrics::kSeqRatioMax, 1.0);
}

// ---- covariance token selection (Clip-Cov, KL-Cov) ---------------------------------------
//
// cov_t = (A_t - mean A) * (logprobs_t - mean logprobs), means over the call's
// loss tokens, computed from the detached view: the selection is a constant for
// the gradient, like every mask (Cui et al. 2025, "The Entropy Mechanism of
// Reinforcement Learning for Reasoning Language Models").

// Per-token covariance term; 0 on tokens that are not loss tokens.
inline std::vector<double> token_covariance(const Data &sg) {
    const auto &lp = sg.at("logprobs");
    const auto &adv = sg.at("advantages");
    std::vector<double> cov(static_cast<size_t>(sg.n), 0.0);
    if (sg.loss_tokens == 0) return cov;
    double mean_a = 0, mean_lp = 0;
    for (int64_t t = 0; t < sg.n; ++t)
        if (sg.mask[t] != 0) {
            mean_a += adv[t];
            mean_lp += lp[t];
        }
    mean_a /= double(sg.loss_tokens);
    mean_lp /= double(sg.loss_tokens);
    for (int64_t t = 0; t < sg.n; ++t)
        if (sg.mask[t] != 0) cov[t] = (adv[t] - mean_a) * (lp[t] - mean_lp);
    return cov;
}

// How many tokens to select: max(floor(ratio * loss tokens of the call), 1), 0
// when the call has no loss token.
inline int64_t selection_count(double ratio, int64_t loss_tokens) {
    if (loss_tokens == 0) return 0;
    return std::max<int64_t>(static_cast<int64_t>(std::floor(ratio * double(loss_tokens))), 1);
}

// The k candidates with the largest cov, ties to the lower token index.
inline std::vector<int64_t> select_top(std::vector<int64_t> candidates,
                                       const std::vector<double> &cov, int64_t k) {
    std::stable_sort(candidates.begin(), candidates.end(),
                     [&](int64_t a, int64_t b) { return cov[a] > cov[b]; });
    if (int64_t(candidates.size()) > k) candidates.resize(static_cast<size_t>(k));
    std::sort(candidates.begin(), candidates.end());
    return candidates;
}

// k candidates drawn uniformly without replacement. The generator is seeded
// with `seed` mixed with the bits of the call's detached logprobs and
// advantages on loss tokens, so one call always selects the same tokens and
// different batches get independent draws.
inline std::vector<int64_t> select_random(std::vector<int64_t> candidates, const Data &sg,
                                          int64_t seed, int64_t k) {
    uint64_t h = Rng(static_cast<uint64_t>(seed)).next();
    const auto &lp = sg.at("logprobs");
    const auto &adv = sg.at("advantages");
    for (int64_t t = 0; t < sg.n; ++t) {
        if (sg.mask[t] == 0) continue;
        for (double x : {lp[t], adv[t]}) {
            uint64_t bits;
            std::memcpy(&bits, &x, sizeof bits);
            h = Rng(h ^ bits).next();
        }
    }
    Rng rng(h);
    const size_t m = std::min(candidates.size(), static_cast<size_t>(k));
    for (size_t i = 0; i < m; ++i) { // partial Fisher-Yates
        const size_t j = i + static_cast<size_t>(rng.below(candidates.size() - i));
        std::swap(candidates[i], candidates[j]);
    }
    candidates.resize(m);
    std::sort(candidates.begin(), candidates.end());
    return candidates;
}

} // namespace rl::sdk::loss
