// rl/core/text.hpp: string helpers shared by core/ and the host. Torch-free,
// header-only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rl::core {

/// The pieces of `s` between the separators `sep`, empty ones included: n
/// separators give n + 1 pieces ("" gives one empty piece).
inline std::vector<std::string> split(const std::string &s, char sep) {
    std::vector<std::string> pieces;
    size_t start = 0;
    while (true) {
        const size_t at = s.find(sep, start);
        if (at == std::string::npos) break;
        pieces.push_back(s.substr(start, at - start));
        start = at + 1;
    }
    pieces.push_back(s.substr(start));
    return pieces;
}

/// `s` made safe to place in HTML, as markupsafe.escape does it (& < > " '
/// become entities): the Jinja engine's `escape`, `rlhost report`.
inline std::string html_escape(const std::string &s) {
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

/// Base64 (RFC 4648, the standard alphabet) of `n` bytes, padded with '='.
inline std::string base64_encode(const void *data, size_t n) {
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const auto *p = static_cast<const uint8_t *>(data);
    std::string out;
    out.reserve((n + 2) / 3 * 4);
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t b0 = p[i], b1 = i + 1 < n ? p[i + 1] : 0, b2 = i + 2 < n ? p[i + 2] : 0;
        const uint32_t w = b0 << 16 | b1 << 8 | b2;
        out += kAlphabet[(w >> 18) & 63];
        out += kAlphabet[(w >> 12) & 63];
        out += i + 1 < n ? kAlphabet[(w >> 6) & 63] : '=';
        out += i + 2 < n ? kAlphabet[w & 63] : '=';
    }
    return out;
}

/// The bytes of base64 text (standard alphabet; trailing '=' padding
/// optional, at most two); none when anything else is in it.
inline std::optional<std::vector<uint8_t>> base64_decode(const std::string &s) {
    static const auto table = [] {
        const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        std::array<int, 256> t{};
        t.fill(-1);
        for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = i;
        return t;
    }();
    std::vector<uint8_t> out;
    out.reserve(s.size() / 4 * 3);
    uint32_t acc = 0;
    int bits = 0;
    size_t pad = 0;
    for (char ch : s) {
        if (ch == '=') {
            ++pad;
            continue;
        }
        const int v = table[static_cast<unsigned char>(ch)];
        if (v < 0 || pad > 0) return std::nullopt;
        acc = (acc << 6) | static_cast<uint32_t>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<uint8_t>((acc >> bits) & 0xFF));
        }
    }
    if (pad > 2) return std::nullopt;
    return out;
}

/// A tensor shape as errors write it, "[2, 3]": any range of integers
/// (std::vector<int64_t>, at::IntArrayRef).
template <class Dims>
std::string shape_text(const Dims &dims) {
    std::string out = "[";
    for (const auto d : dims) out += (out.size() > 1 ? ", " : "") + std::to_string(d);
    return out + "]";
}

} // namespace rl::core
