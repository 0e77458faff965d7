// rl/sdk/utf8_rng.hpp: a portable seeded RNG and UTF-8 decoding / encoding for
// plugins (envs draw tasks, losses draw token selections, filters and envs read
// model text). Header-only, C++17, no dependency.
//
// Randomness: std:: distributions differ between standard libraries, so
// plugins that must give the same numbers everywhere use SplitMix64 (Steele et
// al. 2014) with rejection sampling. Rng(seed, index) is stream `index` of
// `seed`: task i of an env's sample(n, seed) comes from its own stream, so
// sample(n, seed) is a prefix of sample(n + k, seed).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rl::sdk {

// One SplitMix64 step: advances `state` and returns the next output.
inline uint64_t splitmix64(uint64_t &state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    // Stream `index` of `seed`.
    Rng(uint64_t seed, uint64_t index) : state_(seed) {
        uint64_t s = index ^ 0xD1B54A32D192ED03ull;
        state_ ^= splitmix64(s);
        splitmix64(state_);
    }
    uint64_t next() { return splitmix64(state_); }
    // Uniform in [lo, hi] (inclusive), unbiased.
    int64_t uniform(int64_t lo, int64_t hi) {
        const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
        if (span == UINT64_MAX) return static_cast<int64_t>(next());
        return static_cast<int64_t>(static_cast<uint64_t>(lo) + below(span + 1));
    }
    // Uniform in [0, n), n > 0, unbiased.
    uint64_t below(uint64_t n) {
        const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
        uint64_t x;
        do {
            x = next();
        } while (x >= limit);
        return x % n;
    }

private:
    uint64_t state_;
};

namespace utf8 {

// Malformed bytes decode to kInvalidBase + byte: values that are not code
// points, so they never compare equal to a real character, and encode() writes
// the byte back unchanged.
inline constexpr uint32_t kInvalidBase = 0x110000;

// Code points of `s`; *ok (when given) tells whether `s` was valid UTF-8
// (overlong forms, surrogates and values above U+10FFFF are malformed).
inline std::vector<uint32_t> decode(std::string_view s, bool *ok = nullptr) {
    std::vector<uint32_t> out;
    if (ok) *ok = true;
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        size_t len = 0;
        uint32_t cp = 0, min = 0;
        if (c < 0x80) {
            len = 1;
            cp = c;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
            min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
            min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
            min = 0x10000;
        }
        bool good = len > 0 && i + len <= s.size();
        for (size_t k = 1; good && k < len; ++k) {
            const unsigned char d = static_cast<unsigned char>(s[i + k]);
            if ((d & 0xC0) != 0x80)
                good = false;
            else
                cp = (cp << 6) | (d & 0x3F);
        }
        if (good && len > 1 && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)))
            good = false;
        if (!good) {
            if (ok) *ok = false;
            out.push_back(kInvalidBase + c);
            ++i;
            continue;
        }
        out.push_back(cp);
        i += len;
    }
    return out;
}

// Appends the UTF-8 bytes of code point `cp` (below kInvalidBase) to `out`.
inline void append(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

// UTF-8 bytes of `cps` (kInvalidBase + byte writes the byte).
inline std::string encode(const std::vector<uint32_t> &cps) {
    std::string out;
    for (uint32_t cp : cps) {
        if (cp >= kInvalidBase)
            out += static_cast<char>(cp - kInvalidBase);
        else
            append(out, cp);
    }
    return out;
}

} // namespace utf8
} // namespace rl::sdk
