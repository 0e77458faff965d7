// rl/core/text.hpp: string helpers shared by core/ and the host. Torch-free,
// header-only.
#pragma once

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

} // namespace rl::core
