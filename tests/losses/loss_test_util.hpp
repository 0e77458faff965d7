// tests/losses/loss_test_util.hpp: inputs for the loss tests (random packed
// batches with padding and every ratio band), and running a loss class either
// through the SDK test host (the C++ path of production) or directly.
#pragma once

#include "loss_registry.hpp" // generated: every loss plugin of the build
#include "loss_run_once.hpp" // run_once<L>

#include <rl/sdk/testing.hpp>

#include <cmath>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace rl::losses::test {

namespace T = rl::sdk::testing;

// A packed batch: float inputs by name, optional int64 labels.
struct Batch {
    std::vector<int64_t> cu;
    std::map<std::string, std::vector<double>> f;
    std::vector<int64_t> labels;
    bool has_labels = false;
    double global_tokens = 0, global_seqs = 0;

    int64_t n() const { return cu.empty() ? 0 : cu.back(); }
    int64_t n_seqs() const { return static_cast<int64_t>(cu.size()) - 1; }
    std::vector<double> &operator[](const std::string &k) { return f.at(k); }
    const std::vector<double> &operator[](const std::string &k) const { return f.at(k); }

    T::LossInputs inputs() const {
        T::LossInputs in;
        for (const auto &kv : f) in.f64(kv.first, kv.second);
        if (has_labels) in.i64("labels", labels);
        in.cu_seqlens(cu).global(global_tokens, global_seqs);
        return in;
    }
    // Keeps only the named inputs (and labels if named).
    Batch only(const std::vector<std::string> &names) const {
        Batch b = *this;
        b.f.clear();
        b.has_labels = false;
        for (const auto &n : names) {
            if (n == "labels") {
                b.has_labels = has_labels;
            } else if (f.count(n)) {
                b.f[n] = f.at(n);
            }
        }
        return b;
    }
};

// Ratios exp(logprobs - old) are drawn from these anchors (times a 1% jitter),
// so every clip / mask band of the tests has tokens inside and outside it and
// no token sits within 1% of a kink of a differentiated function.
inline const std::vector<double> &ratio_anchors() {
    static const std::vector<double> a = {0.05, 0.15, 0.5, 0.9, 1.0, 1.1, 1.5, 2.5, 4.0, 9.0};
    return a;
}

struct Rng {
    std::mt19937_64 g;
    explicit Rng(uint64_t seed) : g(seed) {}
    double uni(double a, double b) { return std::uniform_real_distribution<double>(a, b)(g); }
    int64_t pick(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(g); }
    bool coin(double p = 0.5) { return uni(0, 1) < p; }
    double anchor_ratio() {
        return ratio_anchors()[pick(int64_t(ratio_anchors().size()))] * std::exp(uni(-0.01, 0.01));
    }
};

struct GenOptions {
    std::vector<int64_t> lens = {6, 1, 9, 4, 11, 5, 3}; // sequence 3 is all padding
    // When non-empty, each sequence's geometric-mean ratio exp(mean log ratio over
    // its loss tokens) is set to targets[s % size] (GSPO's sequence ratio).
    std::vector<double> seq_ratio_targets;
    double vf_clip = 0.2; // keeps values away from the value-clip kinks
};

// Every standard input over one packed batch, with a loss mask that masks a
// prompt prefix, a fully masked sequence and scattered tokens.
inline Batch random_batch(uint64_t seed, const GenOptions &opt = {}) {
    Rng r(seed);
    Batch b;
    b.cu = {0};
    for (auto l : opt.lens) b.cu.push_back(b.cu.back() + l);
    const int64_t n = b.n();
    std::vector<double> mask(n, 1.0), lp(n), adv(n), roll(n), prox(n), ref(n), teacher(n), ent(n),
        values(n), old_values(n), returns(n);
    b.labels.assign(n, 0);
    b.has_labels = true;
    for (int64_t s = 0; s < b.n_seqs(); ++s) {
        const int64_t len = b.cu[s + 1] - b.cu[s];
        const int64_t prompt = len > 1 ? r.pick(std::min<int64_t>(3, len)) : 0;
        for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t) {
            const int64_t k = t - b.cu[s];
            const bool in_prompt = k < prompt;
            b.labels[t] = in_prompt ? -100 : r.pick(50000);
            if (in_prompt || s == 3 || (len > 2 && r.coin(0.1))) mask[t] = 0.0;
        }
    }
    for (int64_t t = 0; t < n; ++t) {
        lp[t] = r.uni(-3.0, -0.05);
        prox[t] = lp[t] - std::log(r.anchor_ratio());
        adv[t] = (r.coin() ? 1.0 : -1.0) * r.uni(0.2, 2.0);
        roll[t] = lp[t] - r.uni(-2.6, 1.0);
        ref[t] = lp[t] + r.uni(-1.0, 1.0);
        teacher[t] = lp[t] + r.uni(-1.5, 1.5);
        ent[t] = r.uni(0.05, 3.0);
        values[t] = r.uni(-2.0, 2.0);
        const double dv = (r.coin() ? 1.0 : -1.0) * opt.vf_clip *
                          std::vector<double>{0.25, 0.5, 1.5, 3.0}[r.pick(4)];
        old_values[t] = values[t] - dv;
        const double vc =
            std::clamp(values[t], old_values[t] - opt.vf_clip, old_values[t] + opt.vf_clip);
        do {
            returns[t] = r.uni(-2.0, 2.0);
        } while (std::fabs(returns[t] - 0.5 * (values[t] + vc)) < 1e-3);
    }
    // Policy losses compare logprobs with old_logprobs: give that pair the anchors.
    std::vector<double> old_direct(n);
    for (int64_t t = 0; t < n; ++t) old_direct[t] = lp[t] - std::log(r.anchor_ratio());
    if (!opt.seq_ratio_targets.empty()) {
        for (int64_t s = 0; s < b.n_seqs(); ++s) {
            double sum = 0;
            int64_t k = 0;
            for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t)
                if (mask[t] != 0) {
                    sum += lp[t] - old_direct[t];
                    ++k;
                }
            if (!k) continue;
            const double shift =
                std::log(opt.seq_ratio_targets[s % opt.seq_ratio_targets.size()]) - sum / double(k);
            for (int64_t t = b.cu[s]; t < b.cu[s + 1]; ++t) old_direct[t] -= shift;
        }
    }
    b.f = {{"loss_mask", mask},
           {"logprobs", lp},
           {"old_logprobs", old_direct},
           {"advantages", adv},
           {"rollout_logprobs", roll},
           {"prox_logprobs", prox},
           {"ref_logprobs", ref},
           {"teacher_logprobs", teacher},
           {"entropy", ent},
           {"values", values},
           {"old_values", old_values},
           {"returns", returns}};
    // Per-token weight streams (dppo / ipo components, rollout importance
    // weights): their own generator, so the inputs above do not depend on them.
    Rng rw(seed * 104729 + 17);
    for (const char *name :
         {"rl_weights", "ce_weights", "ref_kl_weights", "rollout_is_weights", "weights"}) {
        std::vector<double> w(n);
        for (int64_t t = 0; t < n; ++t) w[t] = rw.coin(0.2) ? 0.0 : rw.uni(0.2, 2.0);
        b.f[name] = std::move(w);
    }
    // log Z of each token's logits (z-loss): its own generator too.
    Rng rz(seed * 7 + 3);
    std::vector<double> lse(n);
    for (int64_t t = 0; t < n; ++t) lse[t] = rz.uni(-2.0, 6.0);
    b.f["logsumexp"] = std::move(lse);
    return b;
}

// For decoupled_ppo: old_logprobs is the behaviour policy behind prox_logprobs.
inline Batch decoupled_batch(uint64_t seed, const GenOptions &opt = {}) {
    Batch b = random_batch(seed, opt);
    Rng r(seed * 7919 + 1);
    for (int64_t t = 0; t < b.n(); ++t)
        b["old_logprobs"][t] = b["prox_logprobs"][t] - r.uni(-1.2, 1.2);
    return b;
}

// ---- running a loss -----------------------------------------------------------

// The inputs a loss instance accepts (required + optional), from its signature.
template <class L>
std::vector<std::string> accepted_inputs(const T::Instance<L> &inst) {
    const auto sig = T::loss_signature(inst);
    std::vector<std::string> v = sig.required;
    v.insert(v.end(), sig.optional.begin(), sig.optional.end());
    return v;
}

// The per-token data of a batch as the plugin reads it (for evaluate()).
template <class L>
Data prepare(const L &loss, const Batch &b) {
    const T::LossInputs in = b.inputs();
    const rl_loss_inputs_t v = in.view();
    rl::sdk::LossBatch lb;
    lb.inputs = rl::sdk::Inputs(v.tensors);
    lb.cu_seqlens = rl::sdk::read_cu_seqlens(v.cu_seqlens, b.n());
    lb.n_tokens = b.n();
    lb.global_tokens = b.global_tokens;
    lb.global_seqs = b.global_seqs;
    return loss.prepare(lb);
}

} // namespace rl::losses::test
