// Run configuration: the key-table, key-path and message-text helpers config_internal.hpp declares.
#include "config_internal.hpp"
#include "rl/host/runtime.hpp"

#include <algorithm>
#include <set>
#include <sstream>

namespace rl::host::config_detail {

[[noreturn]] void bad(const std::string &where, const std::string &what) {
    throw HostError{RL_ERR_INVALID_ARG, where + ": " + what};
}

const ConfigKey *find_key(const Keys &keys, const std::string &path) {
    for (const auto &k : keys)
        if (path == k.key) return &k;
    return nullptr;
}

// Names directly under `prefix` ("" for the top level).
std::vector<std::string> children(const Keys &keys, const std::string &prefix) {
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const auto &k : keys) {
        std::string p = k.key;
        if (!prefix.empty()) {
            if (p.compare(0, prefix.size() + 1, prefix + ".") != 0) continue;
            p = p.substr(prefix.size() + 1);
        }
        std::string head = p.substr(0, p.find('.'));
        if (seen.insert(head).second) out.push_back(head);
    }
    return out;
}

bool is_section(const Keys &keys, const std::string &path) {
    return !find_key(keys, path) && !children(keys, path).empty();
}

std::string join(const std::vector<std::string> &xs) {
    std::string s;
    for (const auto &x : xs) s += (s.empty() ? "" : ", ") + x;
    return s;
}

namespace {

// Length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), 0 if there is none.
size_t utf8_seq(const std::string &s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
    const unsigned char c = b(i);
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; // the range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (i + n > s.size() || b(i + 1) < lo || b(i + 1) > hi) return 0;
    for (size_t k = 2; k < n; ++k)
        if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
    return n;
}

} // namespace

// The byte offset of the first ill-formed UTF-8 in `s`, or npos.
size_t bad_utf8_at(const std::string &s) {
    for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_seq(s, i);
        if (n == 0) return i;
        i += n;
    }
    return std::string::npos;
}

// `s` for a message: control characters and ill-formed UTF-8 as \xHH, cut
// after kMaxShownChars characters.
std::string printable(const std::string &s) {
    std::string out;
    size_t chars = 0;
    for (size_t i = 0; i < s.size(); ++chars) {
        if (chars == kMaxShownChars) return out + "...";
        const size_t n = utf8_seq(s, i);
        const auto c = static_cast<unsigned char>(s[i]);
        if (n == 0 || c < 0x20 || c == 0x7F) {
            static const char *hex = "0123456789ABCDEF";
            out += std::string("\\x") + hex[c >> 4] + hex[c & 15];
            ++i;
        } else {
            out.append(s, i, n);
            i += n;
        }
    }
    return out;
}

size_t parts_of(const std::string &key) {
    return static_cast<size_t>(std::count(key.begin(), key.end(), '.')) + 1;
}

void set_path(json &cfg, const std::string &path, json value) {
    json *cur = &cfg;
    std::stringstream ss(path);
    std::string part;
    std::vector<std::string> parts;
    while (std::getline(ss, part, '.')) parts.push_back(part);
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
        json &next = (*cur)[parts[i]];
        if (!next.is_object()) next = json::object();
        cur = &next;
    }
    (*cur)[parts.back()] = std::move(value);
}

} // namespace rl::host::config_detail
