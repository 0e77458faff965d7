// rl/sdk/text.hpp: ASCII whitespace and trimming, shared by the env toolkit
// (env.hpp) and the tool-call parser (tool_calls.hpp). Header-only, C++17,
// the standard library only.
#pragma once

#include <string_view>

namespace rl::sdk::text {

inline bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

inline std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

} // namespace rl::sdk::text
