// plugins/losses/common/covariance.hpp: the token selection of the Clip-Cov and
// KL-Cov losses (Cui et al. 2025, "The Entropy Mechanism of Reinforcement
// Learning for Reasoning Language Models"; verl "clip_cov" / "kl_cov").
//
// cov_t = (A_t - mean A) * (logprobs_t - mean logprobs), means over the call's
// loss tokens, computed from the detached view: the selection is a constant
// for the gradient, like every mask.
#pragma once

#include "loss_common.hpp"

#include <cstring>

namespace rl::losses {

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

// How many tokens the losses select: max(floor(ratio * loss tokens of the call), 1),
// 0 when the call has no loss token.
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

// splitmix64: a small, fully specified generator (the same numbers on every
// platform, unlike std:: distributions).
struct SplitMix64 {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    uint64_t below(uint64_t n) { // uniform in [0, n), n > 0
        const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
        uint64_t x;
        do {
            x = next();
        } while (x >= limit);
        return x % n;
    }
};

// k candidates drawn uniformly without replacement. The generator is seeded
// with `seed` mixed with the bits of the call's detached logprobs and
// advantages on loss tokens, so one call always selects the same tokens and
// different batches get independent draws.
inline std::vector<int64_t> select_random(std::vector<int64_t> candidates, const Data &sg,
                                          int64_t seed, int64_t k) {
    SplitMix64 rng{static_cast<uint64_t>(seed)};
    uint64_t h = rng.next();
    const auto &lp = sg.at("logprobs");
    const auto &adv = sg.at("advantages");
    for (int64_t t = 0; t < sg.n; ++t) {
        if (sg.mask[t] == 0) continue;
        for (double x : {lp[t], adv[t]}) {
            uint64_t bits;
            std::memcpy(&bits, &x, sizeof bits);
            h = SplitMix64{h ^ bits}.next();
        }
    }
    rng.state = h;
    const size_t m = std::min(candidates.size(), static_cast<size_t>(k));
    for (size_t i = 0; i < m; ++i) { // partial Fisher-Yates
        const size_t j = i + static_cast<size_t>(rng.below(candidates.size() - i));
        std::swap(candidates[i], candidates[j]);
    }
    candidates.resize(m);
    std::sort(candidates.begin(), candidates.end());
    return candidates;
}

} // namespace rl::losses
