// rl/sdk/advantage.hpp: the group-advantage toolkit for advantage estimators
// (header-only, C++17, ABI + SDK only): input checks, the loss mask, grouping
// sequences by prompt (group id), per-group mean / std, normalization and
// whitening, broadcasting sequence values to tokens, and the standard metrics
// (rl/sdk/metrics.hpp). Everything is computed in double on the CPU;
// per-token vectors are small.
//
// Conventions shared by every estimator (docs/advantages.md):
//   * a group is the set of sequences with the same group id; members need not
//     be contiguous and groups may have different sizes;
//   * "completion tokens" are the tokens with loss_mask = 1 (all tokens when
//     loss_mask is absent); every other token gets advantage 0;
//   * a sequence's length, for length-weighted means, is its number of
//     completion tokens;
//   * normalization is (x - mean) / (std + eps); a set of values that are all
//     exactly equal normalizes to exactly 0.
#pragma once

#include "metrics.hpp"
#include "sdk.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace rl::sdk::advantage {

using rl::sdk::AdvantageBatch;
using rl::sdk::Call;
using rl::sdk::invalid;

// Refuses per-token inputs the estimator does not use (a typo or a wrong
// estimator would otherwise be ignored silently) and requires `required`.
// `setting` (e.g. "with source: rewards") says which configuration refuses the
// input. Messages do not name the estimator: the host prefixes every failure
// with "advantage '<name>': " already (runtime.hpp, Instance::call).
inline void check_inputs(const AdvantageBatch &b, const std::vector<std::string> &accepted,
                         const std::vector<std::string> &required = {},
                         const std::string &setting = "") {
    for (const auto &kv : b.tensors.all()) {
        if (std::find(accepted.begin(), accepted.end(), kv.first) == accepted.end())
            invalid("input '" + kv.first + "' is not used by this estimator" +
                    (setting.empty() ? std::string() : " " + setting) +
                    "; it accepts: " + rl::sdk::Params::join(accepted));
    }
    for (const auto &name : required) {
        if (!b.tensors.has(name))
            invalid("missing per-token input '" + name + "'; present: " + b.tensors.list());
    }
}

// loss_mask as 0/1 bytes [n_tokens]; all ones when absent. Values other than
// 0 and 1 are refused with the token index.
inline std::vector<uint8_t> read_mask(const AdvantageBatch &b) {
    const int64_t n = b.n_tokens();
    std::vector<uint8_t> mask(static_cast<size_t>(n), 1);
    const rl::sdk::TensorRef *m = b.tensors.find("loss_mask");
    if (!m) return mask;
    for (int64_t t = 0; t < n; ++t) {
        const double x = (*m)[t];
        if (x != 0.0 && x != 1.0)
            invalid("input 'loss_mask' must hold 0 or 1, got " + std::to_string(x) + " at token " +
                    std::to_string(t));
        mask[static_cast<size_t>(t)] = x != 0.0 ? 1 : 0;
    }
    return mask;
}

// A per-token tensor as doubles, or zeros when absent.
inline std::vector<double> read_tokens(const AdvantageBatch &b, const std::string &name) {
    const rl::sdk::TensorRef *t = b.tensors.find(name);
    if (!t) return std::vector<double>(static_cast<size_t>(b.n_tokens()), 0.0);
    return t->to_vector();
}

// Sequence indices of each group, groups in order of first appearance and
// members in batch order.
inline std::vector<std::vector<int64_t>> group_members(const std::vector<int64_t> &ids) {
    std::vector<std::vector<int64_t>> groups;
    std::unordered_map<int64_t, size_t> index;
    for (size_t i = 0; i < ids.size(); ++i) {
        auto it = index.find(ids[i]);
        if (it == index.end()) {
            index.emplace(ids[i], groups.size());
            groups.push_back({static_cast<int64_t>(i)});
        } else {
            groups[it->second].push_back(static_cast<int64_t>(i));
        }
    }
    return groups;
}

// Number of completion tokens of each sequence.
inline std::vector<double> completion_lengths(const std::vector<int64_t> &cu,
                                              const std::vector<uint8_t> &mask) {
    std::vector<double> len(cu.size() - 1, 0.0);
    for (size_t s = 0; s + 1 < cu.size(); ++s)
        for (int64_t t = cu[s]; t < cu[s + 1]; ++t) len[s] += mask[static_cast<size_t>(t)];
    return len;
}

// Each sequence's advantage on its completion tokens, 0 elsewhere.
inline std::vector<double> broadcast(const std::vector<double> &seq_adv,
                                     const std::vector<int64_t> &cu,
                                     const std::vector<uint8_t> &mask) {
    std::vector<double> out(static_cast<size_t>(cu.back()), 0.0);
    for (size_t s = 0; s + 1 < cu.size(); ++s)
        for (int64_t t = cu[s]; t < cu[s + 1]; ++t)
            if (mask[static_cast<size_t>(t)]) out[static_cast<size_t>(t)] = seq_adv[s];
    return out;
}

inline bool all_equal(const std::vector<double> &xs) {
    for (double x : xs)
        if (x != xs.front()) return false;
    return true;
}

inline double mean_of(const std::vector<double> &xs) {
    if (xs.empty()) return 0.0;
    double s = 0.0;
    for (double x : xs) s += x;
    return s / static_cast<double>(xs.size());
}

// Standard deviation around the plain mean; `unbiased` divides by n - 1
// (0 when n < 2).
inline double std_of(const std::vector<double> &xs, bool unbiased) {
    const size_t n = xs.size();
    if (n < 2) return 0.0;
    const double m = mean_of(xs);
    double ss = 0.0;
    for (double x : xs) ss += (x - m) * (x - m);
    return std::sqrt(ss / static_cast<double>(unbiased ? n - 1 : n));
}

// Sum(w x) / Sum(w); the plain mean when every weight is 0.
inline double weighted_mean(const std::vector<double> &xs, const std::vector<double> &ws) {
    double sw = 0.0, swx = 0.0;
    for (size_t i = 0; i < xs.size(); ++i) {
        sw += ws[i];
        swx += ws[i] * xs[i];
    }
    return sw > 0.0 ? swx / sw : mean_of(xs);
}

// (x - mean) / (std + eps) over xs; all-equal values give exactly 0.
inline std::vector<double> normalize(const std::vector<double> &xs, double eps, bool unbiased) {
    std::vector<double> out(xs.size(), 0.0);
    if (xs.empty() || all_equal(xs)) return out;
    const double m = mean_of(xs), sd = std_of(xs, unbiased);
    for (size_t i = 0; i < xs.size(); ++i) out[i] = (xs[i] - m) / (sd + eps);
    return out;
}

// Positions of the completion tokens of sequence s, in order.
inline std::vector<int64_t> masked_positions(const std::vector<int64_t> &cu,
                                             const std::vector<uint8_t> &mask, size_t s) {
    std::vector<int64_t> pos;
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t)
        if (mask[static_cast<size_t>(t)]) pos.push_back(t);
    return pos;
}

// Whitens `x` over the completion tokens of the whole batch, in place, with
// the population std (`unbiased`: the sample std, n - 1, as verl's masked_whiten).
inline void whiten_masked(std::vector<double> &x, const std::vector<uint8_t> &mask, double eps,
                          bool unbiased = false) {
    std::vector<double> vals;
    for (size_t t = 0; t < x.size(); ++t)
        if (mask[t]) vals.push_back(x[t]);
    const std::vector<double> w = normalize(vals, eps, unbiased);
    size_t k = 0;
    for (size_t t = 0; t < x.size(); ++t)
        if (mask[t]) x[t] = w[k++];
}

// Summary metrics of a per-token output over completion tokens:
// <prefix>_mean, <prefix>_std (population), <prefix>_min, <prefix>_max (0 when
// there is no completion token).
inline void emit_summary(const Call &call, const std::string &prefix, const std::vector<double> &x,
                         const std::vector<uint8_t> &mask) {
    std::vector<double> vals;
    for (size_t t = 0; t < x.size(); ++t)
        if (mask[t]) vals.push_back(x[t]);
    double lo = 0.0, hi = 0.0;
    if (!vals.empty()) {
        lo = *std::min_element(vals.begin(), vals.end());
        hi = *std::max_element(vals.begin(), vals.end());
    }
    call.metric(prefix + "_mean", mean_of(vals));
    call.metric(prefix + "_std", std_of(vals, false));
    call.metric(prefix + "_min", lo);
    call.metric(prefix + "_max", hi);
}

// The parameters of a (x - mean) / (std + eps) normalization: "eps" and
// "std_unbiased" (the sample std, n - 1; else the population std).
struct StdNorm {
    double eps;
    bool unbiased;
    static StdNorm read(rl::sdk::Params &p, double eps_default, bool unbiased_default) {
        const double eps = p.number("eps", eps_default, 0.0);
        return {eps, p.boolean("std_unbiased", unbiased_default)};
    }
    // std + eps of xs.
    double divisor(const std::vector<double> &xs) const { return std_of(xs, unbiased) + eps; }
};

// The "whiten" switch of the return-based estimators (GAE, REINFORCE++) with
// its StdNorm (eps 1e-6, population std); std_unbiased without whitening is
// refused.
struct Whitening {
    bool on;
    StdNorm norm;
    static Whitening read(rl::sdk::Params &p, bool on_by_default) {
        const bool on = p.boolean("whiten", on_by_default);
        const StdNorm norm = StdNorm::read(p, 1e-6, false);
        if (p.has("std_unbiased") && !on)
            invalid(p.owner() + ": parameter 'std_unbiased' only applies with 'whiten': true");
        return {on, norm};
    }
    // x whitened over the batch's completion tokens when on, as it is otherwise.
    std::vector<double> apply(std::vector<double> x, const std::vector<uint8_t> &mask) const {
        if (on) whiten_masked(x, mask, norm.eps, norm.unbiased);
        return x;
    }
};

// Per-token returns G_t = u_t + gamma * G_{next completion token} (G after the
// last completion token is 0) of every sequence s, over its completion tokens
// only, with u_t = token_rewards[t] plus seq_rewards[s] on the last one; 0 on
// other tokens.
inline std::vector<double> discounted_returns(const std::vector<int64_t> &cu,
                                              const std::vector<uint8_t> &mask,
                                              const std::vector<double> &seq_rewards,
                                              const std::vector<double> &token_rewards,
                                              double gamma) {
    std::vector<double> returns(static_cast<size_t>(cu.back()), 0.0);
    for (size_t s = 0; s < seq_rewards.size(); ++s) {
        const std::vector<int64_t> pos = masked_positions(cu, mask, s);
        double g = 0.0;
        for (size_t j = pos.size(); j-- > 0;) {
            const size_t t = static_cast<size_t>(pos[j]);
            const double u = token_rewards[t] + (j + 1 == pos.size() ? seq_rewards[s] : 0.0);
            g = u + gamma * g;
            returns[t] = g;
        }
    }
    return returns;
}

// The outputs of a return-based estimator: the `advantages` and `returns`
// tensors, reward_mean (of the sequence rewards) and the adv_* and returns_*
// summaries.
inline void emit_returns(const Call &call, const std::vector<double> &rewards,
                         const std::vector<double> &adv, const std::vector<double> &returns,
                         const std::vector<uint8_t> &mask) {
    call.tensor("advantages", adv);
    call.tensor("returns", returns);
    call.metric(metrics::kRewardMean, mean_of(rewards));
    emit_summary(call, metrics::kAdv, adv, mask);
    emit_summary(call, metrics::kReturns, returns, mask);
}

// Sequence-reward metrics shared by the group estimators.
inline void emit_reward_summary(const Call &call, const std::vector<double> &rewards,
                                size_t n_groups, size_t singleton, size_t zero_std) {
    call.metric(metrics::kRewardMean, mean_of(rewards));
    call.metric(metrics::kRewardStd, std_of(rewards, false));
    call.metric(metrics::kGroups, static_cast<double>(n_groups));
    call.metric(metrics::kGroupsSingleton, static_cast<double>(singleton));
    call.metric(metrics::kGroupsZeroStd, static_cast<double>(zero_std));
}

// The skeleton of a group-relative estimator (GRPO, RLOO, pass@k): reads the
// mask and rewards, groups the sequences by group id, and for every group of
// two or more whose rewards are not all equal calls
//   f(members, r, w, seq_adv)
// with the members' sequence indices, rewards r and completion lengths w; f
// writes seq_adv[members[k]]. Groups of one and all-equal groups keep 0 and are
// counted. Then emits the `advantages` tensor (broadcast to completion tokens),
// the reward summary and the adv_* summary.
template <class F>
void group_relative(const Call &call, const AdvantageBatch &b, F &&f) {
    check_inputs(b, {"loss_mask"});
    const std::vector<uint8_t> mask = read_mask(b);
    const std::vector<double> rewards = b.rewards.to_vector();
    const std::vector<double> lengths = completion_lengths(b.cu_seqlens, mask);
    const auto groups = group_members(b.group_ids);

    std::vector<double> seq_adv(rewards.size(), 0.0);
    size_t singleton = 0, zero_std = 0;
    for (const auto &members : groups) {
        std::vector<double> r, w;
        for (int64_t i : members) {
            r.push_back(rewards[static_cast<size_t>(i)]);
            w.push_back(lengths[static_cast<size_t>(i)]);
        }
        if (r.size() == 1) {
            ++singleton;
            continue;
        }
        if (all_equal(r)) {
            ++zero_std;
            continue;
        }
        f(members, r, w, seq_adv);
    }

    const std::vector<double> adv = broadcast(seq_adv, b.cu_seqlens, mask);
    call.tensor("advantages", adv);
    emit_reward_summary(call, rewards, groups.size(), singleton, zero_std);
    emit_summary(call, metrics::kAdv, adv, mask);
}

} // namespace rl::sdk::advantage
