// rl/sdk/loss.hpp: the loss toolkit. Header-only, C++17, depends on the ABI
// and the SDK headers only (never on libtorch). What every loss plugin shares:
//
// - Data: the per-token inputs of one call as double vectors, the loss mask,
//   the sequence structure (cu_seqlens) and the global normalizers; read_batch()
//   checks them against the loss's signature.
// - Aggregation: the loss_agg_mode family (token-mean, seq-mean-token-sum,
//   seq-mean-token-mean, seq-mean-token-sum-norm, sum). Every mode is linear in
//   the per-token losses, so it is a weight per token: L = sum_t w_t * l_t.
// - KL estimators k1 / k2 / k3 (= low_var_kl) / abs and the straight-through
//   k1+ / k3+ (= low_var_kl+); Regularizers: kl_coef against ref_logprobs and
//   entropy_coef on entropy, as every policy loss offers them.
// - Result, Stat, RatioStats: loss, gradients, metrics (rl/sdk/metrics.hpp).
// - LossBase: a loss implements evaluate(live, sg) and gets compute() (input
//   checks, finiteness checks, gradients into the host's buffers, metrics) for
//   free. CrossEntropyLoss: next-token cross-entropy over label tokens.
// - Policy-gradient losses build on rl/sdk/pg_loss.hpp.
//
// Stop-gradient convention: evaluate() takes two views of the same inputs.
// Quantities the loss treats as constants ("detached": TIS weights, CISPO and
// GRPO coefficients, IcePop and GRPO masks) are computed from `sg`; everything
// that is differentiated is computed from `live`. In production both are the
// same object. Tests perturb `live` only, so central finite differences of
// evaluate() check the gradient a stop-gradient implementation must produce.
#pragma once

#include "metrics.hpp"
#include "sdk.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace rl::sdk::loss {

// Descriptor feature of a loss whose gradients are those of a surrogate with
// detached (stop-gradient) factors, as CISPO's and GRPO's coefficients: the
// finite differences of its loss value do not equal its gradients, by design.
// Generic gradient checks (tests/python/test_loss_discovery.py) read it.
inline constexpr const char *kStopGradientFeature = "stop-gradient";
inline const char *const kStopGradientFeatures[] = {kStopGradientFeature, nullptr};

namespace metrics = rl::sdk::metrics;
using rl::sdk::invalid;
using rl::sdk::LossBatch;
using rl::sdk::LossSignature;
using rl::sdk::Params;

inline std::string join(const std::vector<std::string> &xs) {
    return xs.empty() ? std::string("(none)") : Params::join(xs);
}

inline std::string num(double x) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", x);
    return buf;
}

// ---- per-token data ---------------------------------------------------------

struct Data {
    int64_t n = 0;                   // tokens
    std::vector<int64_t> cu;         // [n_seqs + 1]
    std::vector<int64_t> seq;        // sequence index of each token
    std::vector<double> mask;        // 1 for loss tokens, 0 otherwise
    std::vector<int64_t> seq_tokens; // loss tokens per sequence
    int64_t loss_tokens = 0;
    int64_t loss_seqs = 0; // sequences with at least one loss token
    double global_tokens = 0;
    double global_seqs = 0;
    std::map<std::string, std::vector<double>> x; // named float inputs (labels as exact doubles)

    int64_t n_seqs() const { return static_cast<int64_t>(cu.size()) - 1; }
    bool has(const std::string &name) const { return x.count(name) != 0; }
    const std::vector<double> &at(const std::string &name) const {
        auto it = x.find(name);
        if (it == x.end())
            rl::sdk::fail(RL_ERR_INTERNAL, "loss read input '" + name + "' that is not present");
        return it->second;
    }
    const std::vector<double> *find(const std::string &name) const {
        auto it = x.find(name);
        return it == x.end() ? nullptr : &it->second;
    }

    // Builds seq, counts and checks the global normalizers; call after any
    // change to cu or mask.
    void finalize() {
        seq.assign(static_cast<size_t>(n), 0);
        seq_tokens.assign(static_cast<size_t>(n_seqs()), 0);
        loss_tokens = 0;
        loss_seqs = 0;
        for (int64_t s = 0; s < n_seqs(); ++s) {
            for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
                seq[t] = s;
                if (mask[t] != 0) ++seq_tokens[s];
            }
            loss_tokens += seq_tokens[s];
            if (seq_tokens[s] > 0) ++loss_seqs;
        }
        check_global("global_tokens", global_tokens, loss_tokens, "loss tokens");
        check_global("global_seqs", global_seqs, loss_seqs, "sequences with loss tokens");
    }

private:
    static void check_global(const char *name, double v, int64_t local, const char *what) {
        if (!std::isfinite(v) || v < 0)
            invalid(std::string(name) +
                    " must be a finite number >= 0 (0 = this call's count), got " + num(v));
        if (v > 0 && v < static_cast<double>(local))
            invalid(std::string(name) + " (" + num(v) + ") is smaller than the " + what +
                    " in this call (" + std::to_string(local) + ")");
    }
};

struct ReadOptions {
    bool labels_mask = false; // tokens whose label equals ignore_index are not loss tokens
    int64_t ignore_index = -100;
};

// Reads a call's inputs against the loss's signature: refuses missing required
// inputs and undeclared ones, checks dtypes and the 0/1 loss mask.
inline Data read_batch(const LossBatch &b, const LossSignature &sig, const ReadOptions &opt = {}) {
    std::set<std::string> accepted(sig.required.begin(), sig.required.end());
    accepted.insert(sig.optional.begin(), sig.optional.end());
    for (const auto &name : sig.required)
        if (!b.inputs.has(name))
            invalid("missing input '" + name + "'; required: " + join(sig.required) +
                    "; optional: " + join(sig.optional) + "; present: " + b.inputs.list());
    for (const auto &kv : b.inputs.all())
        if (!accepted.count(kv.first))
            invalid("unexpected input '" + kv.first + "'; accepted: " +
                    join(std::vector<std::string>(accepted.begin(), accepted.end())));

    Data d;
    d.cu = b.cu_seqlens;
    d.n = b.n_tokens;
    d.global_tokens = b.global_tokens;
    d.global_seqs = b.global_seqs;
    d.mask.assign(static_cast<size_t>(d.n), 1.0);
    for (const auto &kv : b.inputs.all()) {
        const std::string &name = kv.first;
        const rl::sdk::TensorRef &t = kv.second;
        if (t.size() != d.n)
            invalid("input '" + name + "' has " + std::to_string(t.size()) +
                    " entries, cu_seqlens says " + std::to_string(d.n) + " tokens");
        if (name == "loss_mask") {
            for (int64_t i = 0; i < d.n; ++i) {
                const double m = t[i];
                if (m != 0.0 && m != 1.0)
                    invalid("input 'loss_mask' must hold 0 or 1, got " + num(m) + " at token " +
                            std::to_string(i));
                d.mask[i] = std::min(d.mask[i], m);
            }
        } else if (name == "labels") {
            if (t.is_float())
                invalid("input 'labels' must be an integer tensor (int64), got " +
                        rl::sdk::dtype_name(t.view().dtype));
            std::vector<double> v(static_cast<size_t>(d.n));
            for (int64_t i = 0; i < d.n; ++i) {
                const int64_t lab = t.as_int(i);
                v[i] = static_cast<double>(lab);
                if (opt.labels_mask && lab == opt.ignore_index) d.mask[i] = 0.0;
            }
            d.x[name] = std::move(v);
        } else {
            if (!t.is_float())
                invalid("input '" + name + "' must be float32 or float64, got " +
                        rl::sdk::dtype_name(t.view().dtype));
            d.x[name] = t.to_vector();
        }
    }
    d.finalize();
    return d;
}

// ---- aggregation --------------------------------------------------------------

enum class AggMode { TokenMean, SeqMeanTokenSum, SeqMeanTokenMean, SeqMeanTokenSumNorm, Sum };

struct Aggregation {
    AggMode mode = AggMode::TokenMean;
    int64_t max_seq_len = 0; // seq-mean-token-sum-norm only
    // Accept negative per-token "weights" (cross-entropy: a negative weight
    // pushes a token's logprob down, as Tinker's custom losses send it).
    bool signed_weights = false;

    static const std::vector<std::string> &names() {
        static const std::vector<std::string> n = {"token-mean", "seq-mean-token-sum",
                                                   "seq-mean-token-mean", "seq-mean-token-sum-norm",
                                                   "sum"};
        return n;
    }

    static Aggregation read(Params &p, const std::string &def = "token-mean") {
        Aggregation a;
        const std::string m = p.choice("loss_agg_mode", def, names());
        for (size_t i = 0; i < names().size(); ++i)
            if (names()[i] == m) a.mode = static_cast<AggMode>(i);
        const bool given = p.has("max_seq_len");
        if (a.mode == AggMode::SeqMeanTokenSumNorm) {
            if (!given)
                invalid(p.owner() +
                        ": loss_agg_mode 'seq-mean-token-sum-norm' needs parameter 'max_seq_len' "
                        "(the constant token normalizer, e.g. the generation budget)");
            a.max_seq_len = p.integer("max_seq_len", 0, 1, int64_t(1) << 40);
        } else if (given) {
            invalid(p.owner() +
                    ": parameter 'max_seq_len' only applies to loss_agg_mode "
                    "'seq-mean-token-sum-norm' (loss_agg_mode is '" +
                    m + "')");
        }
        return a;
    }

    // w_t with L = sum_t w_t * l_t; zero on tokens that are not loss tokens.
    // The optional per-token input "weights" (>= 0 unless signed_weights; every loss of the toolkit
    // accepts it) multiplies each token's weight: it scales the whole per-token
    // loss and leaves the normalizers alone.
    std::vector<double> weights(const Data &d) const {
        std::vector<double> w(static_cast<size_t>(d.n), 0.0);
        const std::vector<double> *user = d.find("weights");
        const double tokens = d.global_tokens > 0 ? d.global_tokens : double(d.loss_tokens);
        const double seqs = d.global_seqs > 0 ? d.global_seqs : double(d.loss_seqs);
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            const double ni = double(d.seq_tokens[d.seq[t]]);
            switch (mode) {
                case AggMode::TokenMean:
                    w[t] = 1.0 / tokens;
                    break;
                case AggMode::SeqMeanTokenSum:
                    w[t] = 1.0 / seqs;
                    break;
                case AggMode::SeqMeanTokenMean:
                    w[t] = 1.0 / (ni * seqs);
                    break;
                case AggMode::SeqMeanTokenSumNorm:
                    w[t] = 1.0 / (seqs * double(max_seq_len));
                    break;
                case AggMode::Sum:
                    w[t] = 1.0;
                    break;
            }
            if (user) {
                if ((*user)[t] < 0 && !signed_weights)
                    invalid("input 'weights' must be >= 0, got " + num((*user)[t]) + " at token " +
                            std::to_string(t));
                w[t] *= (*user)[t];
            }
        }
        return w;
    }
};

// ---- KL estimators --------------------------------------------------------------

// Estimators of KL(pi || ref) from one sample, with d = lp - ref:
// k1 = d, k2 = d^2 / 2, k3 = exp(-d) + d - 1, abs = |d|. The straight-through
// variants k1+, k3+ (= low_var_kl+) have the value of k1 / k3 and the gradient
// of k2 (verl's "+" suffix).
enum class KlType { K1, K2, K3, Abs };

struct KlEstimator {
    KlType value = KlType::K3;     // the estimator whose value is reported and added
    bool straight_through = false; // gradient of k2 instead of the value's own

    static const std::vector<std::string> &names() {
        static const std::vector<std::string> n = {"k1",  "k2",  "k3",  "low_var_kl",
                                                   "abs", "k1+", "k3+", "low_var_kl+"};
        return n;
    }
};

inline KlEstimator read_kl_type(Params &p, const std::string &key = "kl_type") {
    std::string s = p.choice(key, "k3", KlEstimator::names());
    KlEstimator k;
    if (s.back() == '+') {
        k.straight_through = true;
        s.pop_back();
    }
    k.value = s == "k1"    ? KlType::K1
              : s == "k2"  ? KlType::K2
              : s == "abs" ? KlType::Abs
                           : KlType::K3;
    return k;
}

inline double kl_value(KlType k, double lp, double ref) {
    const double d = lp - ref;
    switch (k) {
        case KlType::K1:
            return d;
        case KlType::K2:
            return 0.5 * d * d;
        case KlType::Abs:
            return std::fabs(d);
        default:
            return std::exp(-d) + d - 1.0;
    }
}
inline double kl_grad(KlType k, double lp, double ref) { // d / d lp
    const double d = lp - ref;
    switch (k) {
        case KlType::K1:
            return 1.0;
        case KlType::K2:
            return d;
        case KlType::Abs:
            return d > 0 ? 1.0 : d < 0 ? -1.0 : 0.0;
        default:
            return 1.0 - std::exp(-d);
    }
}

// The per-token KL term as a function of the live logprob `lp` and its
// detached copy `lp_sg` (equal in production). Plain estimators: k(lp).
// Straight-through: k(sg) + k2(lp) - k2(sg), whose value is k and whose
// gradient is k2's.
inline double kl_term(const KlEstimator &k, double lp, double lp_sg, double ref) {
    if (!k.straight_through) return kl_value(k.value, lp, ref);
    return kl_value(k.value, lp_sg, ref) + kl_value(KlType::K2, lp, ref) -
           kl_value(KlType::K2, lp_sg, ref);
}
inline double kl_term_grad(const KlEstimator &k, double lp, double ref) {
    return kl_grad(k.straight_through ? KlType::K2 : k.value, lp, ref);
}

// ---- results and statistics ------------------------------------------------------

struct Result {
    double loss = 0;
    std::map<std::string, std::vector<double>> grad; // d loss / d input, by input name
    std::vector<std::pair<std::string, double>> metrics;
    std::vector<std::pair<std::string, std::vector<double>>> tensors;

    std::vector<double> &g(const std::string &name, int64_t n) {
        auto &v = grad[name];
        if (v.empty()) v.assign(static_cast<size_t>(n), 0.0);
        return v;
    }
    // Declared reductions over micro-batches and ranks (rl_metric_reduction_t
    // and weight; docs/abi.md); a metric without one is RL_METRIC_DEFAULT.
    std::map<std::string, std::pair<rl_metric_reduction_t, double>> reductions;

    void metric(const std::string &name, double v) { metrics.emplace_back(name, v); }
    void metric(const std::string &name, double v, rl_metric_reduction_t red, double weight) {
        metrics.emplace_back(name, v);
        reductions[name] = {red, weight};
    }
    // A mean over `tokens` tokens / `seqs` sequences; a sum (a count); an
    // extreme of `n` values.
    void token_mean(const std::string &name, double v, int64_t tokens) {
        metric(name, v, RL_METRIC_TOKEN_MEAN, double(tokens));
    }
    void seq_mean(const std::string &name, double v, int64_t seqs) {
        metric(name, v, RL_METRIC_SEQ_MEAN, double(seqs));
    }
    void sum(const std::string &name, double v) { metric(name, v, RL_METRIC_SUM, 0.0); }
    void min(const std::string &name, double v, int64_t n) {
        metric(name, v, RL_METRIC_MIN, double(n));
    }
    void max(const std::string &name, double v, int64_t n) {
        metric(name, v, RL_METRIC_MAX, double(n));
    }
    const double *find_metric(const std::string &name) const {
        for (const auto &m : metrics)
            if (m.first == name) return &m.second;
        return nullptr;
    }
};

// Mean / min / max of a masked quantity. Empty: mean `empty_mean`, min and max `empty_extreme`.
struct Stat {
    double sum = 0, lo = std::numeric_limits<double>::infinity(),
           hi = -std::numeric_limits<double>::infinity();
    int64_t count = 0;
    void add(double v) {
        sum += v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        ++count;
    }
    double mean(double empty = 0.0) const { return count ? sum / double(count) : empty; }
    double min(double empty) const { return count ? lo : empty; }
    double max(double empty) const { return count ? hi : empty; }
    // Emitted with their reductions, over tokens (a token mean weighted by
    // count, min, max) or over sequences (seq_mean).
    void emit_mean(Result &r, const std::string &name, double empty = 0.0) const {
        r.token_mean(name, mean(empty), count);
    }
    void emit_seq_mean(Result &r, const std::string &name, double empty = 0.0) const {
        r.seq_mean(name, mean(empty), count);
    }
    void emit_min(Result &r, const std::string &name, double empty) const {
        r.min(name, min(empty), count);
    }
    void emit_max(Result &r, const std::string &name, double empty) const {
        r.max(name, max(empty), count);
    }
};

inline double frac(int64_t k, int64_t n) {
    return n ? double(k) / double(n) : 0.0;
}

// Statistics of the ratio exp(logprobs - old_logprobs) over loss tokens, as
// xorl reports them: ratio_mean / ratio_min / ratio_max, and with
// compute_kl_stats kl_sample_train_k3 = mean(ratio - log ratio - 1) and
// entropy_sample = -mean(old_logprobs). Empty: ratios 1, the others 0.
struct RatioStats {
    Stat ratio, k3, old_nll;
    void add(double log_ratio, double old_lp) {
        const double r = std::exp(log_ratio);
        ratio.add(r);
        k3.add(r - log_ratio - 1.0);
        old_nll.add(-old_lp);
    }
    void emit_ratio(Result &r) const {
        ratio.emit_mean(r, metrics::kRatioMean, 1.0);
        ratio.emit_min(r, metrics::kRatioMin, 1.0);
        ratio.emit_max(r, metrics::kRatioMax, 1.0);
    }
    void emit_kl(Result &r) const {
        k3.emit_mean(r, metrics::kKlSampleTrainK3);
        old_nll.emit_mean(r, metrics::kEntropySample);
    }
};

// ---- z-loss ----------------------------------------------------------------------

// PaLM's z-loss on the softmax normalizer: z_loss * log^2 Z_t per loss token,
// aggregated with the loss's weights, where log Z_t (input "logsumexp", the
// trainer's logsumexp of token t's raw logits, computed in its chunked
// log-softmax pass) is differentiable: d/d logsumexp_t = 2 z_loss w_t log Z_t.
// Shared by the policy losses (Regularizers) and the cross-entropy losses.
struct ZLoss {
    double coef = 0;

    void read(Params &p) { coef = p.number("z_loss", 0.0, 0.0); }
    // logsumexp is read only when the coefficient is non-zero.
    void add_to(LossSignature &s) const {
        if (coef == 0) return;
        s.required.push_back("logsumexp");
        s.differentiable.push_back("logsumexp");
    }
    // Adds the term and its gradient; metric z_loss = mean log^2 Z over loss tokens.
    void apply(const Data &d, const std::vector<double> &w, Result &r) const {
        if (coef == 0) return;
        const auto &lse = d.at("logsumexp");
        auto &g = r.g("logsumexp", d.n);
        Stat s;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            r.loss += w[t] * coef * lse[t] * lse[t];
            g[t] += w[t] * coef * 2.0 * lse[t];
            s.add(lse[t] * lse[t]);
        }
        s.emit_mean(r, metrics::kZLoss);
    }
};

// ---- regularizers shared by every policy loss -------------------------------------

// kl_coef * KL estimator against ref_logprobs and -entropy_coef * entropy, added
// per token to the policy loss and aggregated with the same weights.
struct Regularizers {
    double kl_coef = 0;
    KlEstimator kl_type;
    double entropy_coef = 0;
    ZLoss z;

    // Also accepted under the peers' names (docs/losses.md): verl's
    // kl_loss_coef / kl_loss_type / entropy_coeff, TRL's and xorl's beta.
    void read(Params &p) {
        p.alias("kl_loss_coef", "kl_coef", "verl");
        p.alias("beta", "kl_coef", "TRL");
        p.alias("kl_loss_type", "kl_type", "verl");
        p.alias("entropy_coeff", "entropy_coef", "verl");
        kl_coef = p.number("kl_coef", 0.0, 0.0);
        kl_type = read_kl_type(p);
        entropy_coef = p.number("entropy_coef", 0.0, 0.0);
        z.read(p);
    }
    // ref_logprobs and entropy are always accepted (for the ref_kl / entropy
    // metrics); they are required, and entropy differentiable, when their
    // coefficient is non-zero.
    void add_to(LossSignature &s) const {
        (kl_coef != 0 ? s.required : s.optional).push_back("ref_logprobs");
        (entropy_coef != 0 ? s.required : s.optional).push_back("entropy");
        if (entropy_coef != 0) s.differentiable.push_back("entropy");
        z.add_to(s);
    }
    // Adds the terms to r (loss, logprobs / entropy gradients) and emits the
    // ref_kl / entropy metrics (masked means over loss tokens). `sg` is the
    // detached view (the straight-through KL estimators need it).
    void apply(const Data &d, const Data &sg, const std::vector<double> &w, Result &r) const {
        const auto *ref = d.find("ref_logprobs");
        const auto *ent = d.find("entropy");
        if (ref) {
            const auto &lp = d.at("logprobs");
            const auto &lp_sg = sg.at("logprobs");
            auto &g = r.g("logprobs", d.n);
            Stat s;
            for (int64_t t = 0; t < d.n; ++t) {
                if (d.mask[t] == 0) continue;
                const double k = kl_term(kl_type, lp[t], lp_sg[t], (*ref)[t]);
                s.add(k);
                if (kl_coef != 0) {
                    r.loss += w[t] * kl_coef * k;
                    g[t] += w[t] * kl_coef * kl_term_grad(kl_type, lp[t], (*ref)[t]);
                }
            }
            s.emit_mean(r, metrics::kRefKl);
        }
        if (ent) {
            Stat s;
            std::vector<double> *g = entropy_coef != 0 ? &r.g("entropy", d.n) : nullptr;
            for (int64_t t = 0; t < d.n; ++t) {
                if (d.mask[t] == 0) continue;
                s.add((*ent)[t]);
                if (g) {
                    r.loss -= w[t] * entropy_coef * (*ent)[t];
                    (*g)[t] = -w[t] * entropy_coef;
                }
            }
            s.emit_mean(r, metrics::kEntropy);
        }
        z.apply(d, w, r);
    }
};

// ---- the loss base ----------------------------------------------------------------

class LossBase : public rl::sdk::Loss {
public:
    // The math: loss, gradients w.r.t. the differentiable inputs (computed from
    // `live`, with detached quantities from `sg`), metrics and extra tensors.
    virtual Result evaluate(const Data &live, const Data &sg) const = 0;

    // Reads and checks one call's inputs.
    Data prepare(const LossBatch &b) const { return read_batch(b, signature(), read_options()); }

    double compute(rl::sdk::Call &call, const LossBatch &b, rl::sdk::Grads &grads) final {
        const Data d = prepare(b);
        const Result r = evaluate(d, d);
        if (!std::isfinite(r.loss))
            rl::sdk::fail(RL_ERR_NUMERIC, std::string("the loss is ") +
                                              (std::isnan(r.loss) ? "NaN" : "infinite") +
                                              " (an overflowing ratio exp(logprobs - ...)?)");
        for (const auto &kv : r.grad) {
            for (int64_t t = 0; t < d.n; ++t)
                if (!std::isfinite(kv.second[t]))
                    rl::sdk::fail(RL_ERR_NUMERIC,
                                  "the gradient for '" + kv.first + "' is " +
                                      (std::isnan(kv.second[t]) ? "NaN" : "infinite") +
                                      " at token " + std::to_string(t));
            const rl::sdk::TensorOut *out = grads.find(kv.first);
            if (!out) continue;
            if (out->size() != d.n)
                invalid("gradient buffer '" + kv.first + "' has " + std::to_string(out->size()) +
                        " entries, expected " + std::to_string(d.n));
            out->assign(kv.second);
        }
        for (const auto &m : r.metrics) {
            auto red = r.reductions.find(m.first);
            if (red == r.reductions.end())
                call.metric(m.first, m.second);
            else
                call.metric(m.first, m.second, red->second.first, red->second.second);
        }
        for (const auto &t : r.tensors) call.tensor(t.first, t.second);
        return r.loss;
    }

protected:
    virtual ReadOptions read_options() const { return {}; }
};

// ---- cross-entropy -------------------------------------------------------------------

// Next-token cross-entropy over label tokens: l_t = -logprobs_t on tokens with a
// label (labels != ignore_index) and loss_mask 1, aggregated by loss_agg_mode.
// With per_token_outputs it also returns the tensors `logprobs` and
// `elementwise_loss` (0 on ignored tokens).
class CrossEntropyLoss : public LossBase {
public:
    CrossEntropyLoss(Params &p, bool per_token_outputs) : per_token_(per_token_outputs) {
        ignore_index_ = p.integer("ignore_index", -100);
        agg_ = Aggregation::read(p);
        agg_.signed_weights = true;
        z_.read(p);
    }

    LossSignature signature() const override {
        LossSignature s{{"logprobs", "labels"}, {"loss_mask", "weights"}, {"logprobs"}};
        z_.add_to(s);
        return s;
    }

    Result evaluate(const Data &d, const Data &) const override {
        Result r;
        const auto w = agg_.weights(d);
        const auto &lp = d.at("logprobs");
        auto &g = r.g("logprobs", d.n);
        Stat nll;
        for (int64_t t = 0; t < d.n; ++t) {
            if (d.mask[t] == 0) continue;
            r.loss += -w[t] * lp[t];
            g[t] = -w[t];
            nll.add(-lp[t]);
        }
        r.sum(metrics::kValidTokens, double(d.loss_tokens));
        // exp of a mean: not a mean itself; the host's default (token-weighted).
        r.metric(metrics::kPerplexity, std::exp(nll.mean()));
        if (per_token_) {
            std::vector<double> out_lp(static_cast<size_t>(d.n), 0.0), out_loss(out_lp);
            for (int64_t t = 0; t < d.n; ++t) {
                if (d.mask[t] == 0) continue;
                out_lp[t] = lp[t];
                out_loss[t] = -lp[t];
            }
            r.tensors.emplace_back("logprobs", std::move(out_lp));
            r.tensors.emplace_back("elementwise_loss", std::move(out_loss));
        }
        z_.apply(d, w, r);
        return r;
    }

protected:
    ReadOptions read_options() const override { return {true, ignore_index_}; }

private:
    bool per_token_;
    int64_t ignore_index_ = -100;
    Aggregation agg_;
    ZLoss z_;
};

} // namespace rl::sdk::loss
