#include "unicode.hpp"

#include "rl/core/error.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

namespace rl::core::unicode {
namespace {

// Decodes one sequence at s[i]. Returns the number of bytes it spans; *cp is
// the code point, or -1 when the bytes are ill-formed (then the return value
// is the length of the maximal ill-formed subpart, at least 1). *incomplete
// is set when the input ended inside an otherwise valid sequence.
size_t decode_one(std::string_view s, size_t i, int32_t *cp, bool *incomplete) {
    *incomplete = false;
    const auto b0 = static_cast<uint8_t>(s[i]);
    if (b0 < 0x80) {
        *cp = b0;
        return 1;
    }
    size_t need;
    uint32_t value;
    uint8_t lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
        value = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
        need = 2;
        value = b0 & 0x0F;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        need = 3;
        value = b0 & 0x07;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        *cp = -1;
        return 1;
    }
    size_t k = 1;
    for (; k <= need; ++k) {
        if (i + k >= s.size()) {
            *incomplete = true;
            *cp = -1;
            return k;
        }
        const auto b = static_cast<uint8_t>(s[i + k]);
        const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *cp = -1;
            return k;
        }
        value = (value << 6) | (b & 0x3F);
    }
    *cp = static_cast<int32_t>(value);
    return k;
}

} // namespace

bool valid_utf8(std::string_view s, size_t *bad_pos) {
    size_t i = 0;
    while (i < s.size()) {
        int32_t cp;
        bool incomplete;
        const size_t n = decode_one(s, i, &cp, &incomplete);
        if (cp < 0) {
            if (bad_pos) *bad_pos = i;
            return false;
        }
        i += n;
    }
    return true;
}

std::string encode(uint32_t cp) {
    // 1 to 4 bytes: the lead byte's marker and payload, then 6 bits each.
    const int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (n == 1) return std::string(1, static_cast<char>(cp));
    static constexpr uint8_t kLead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
    std::string out(static_cast<size_t>(n), '\0');
    for (int i = n - 1; i > 0; --i, cp >>= 6)
        out[static_cast<size_t>(i)] = static_cast<char>(0x80 | (cp & 0x3F));
    out[0] = static_cast<char>(kLead[n] | cp);
    return out;
}

size_t char_len(std::string_view s, size_t i) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    return std::min(n, s.size() - i);
}

std::string lossy(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size());
    size_t i = 0;
    while (i < bytes.size()) {
        int32_t cp;
        bool incomplete;
        const size_t n = decode_one(bytes, i, &cp, &incomplete);
        if (cp < 0)
            out += "\xEF\xBF\xBD";
        else
            out.append(bytes.substr(i, n));
        i += n;
    }
    return out;
}

size_t emit_prefix_len(std::string_view bytes) {
    size_t i = 0;
    while (i < bytes.size()) {
        int32_t cp;
        bool incomplete;
        const size_t n = decode_one(bytes, i, &cp, &incomplete);
        if (incomplete) return i;
        i += n;
    }
    return i;
}

std::string normalize(std::string_view s, Form form) {
    int options = UTF8PROC_STABLE;
    switch (form) {
        case Form::NFC:
            options |= UTF8PROC_COMPOSE;
            break;
        case Form::NFD:
            options |= UTF8PROC_DECOMPOSE;
            break;
        case Form::NFKC:
            options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
            break;
        case Form::NFKD:
            options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
            break;
    }
    utf8proc_uint8_t *out = nullptr;
    const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t *>(s.data()),
                                            static_cast<utf8proc_ssize_t>(s.size()), &out,
                                            static_cast<utf8proc_option_t>(options));
    if (n < 0) throw Error(std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
    std::string r(reinterpret_cast<const char *>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
}

bool is_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_white_space(uint32_t cp) {
    return is_space(cp) && !(cp >= 0x1C && cp <= 0x1F);
}

uint32_t code_point_at(std::string_view s, size_t i) {
    int32_t cp;
    bool incomplete;
    decode_one(s, i, &cp, &incomplete);
    return cp < 0 ? 0xFFFD : static_cast<uint32_t>(cp);
}

std::string white_space_as_hf(const std::string &p) {
    std::string out;
    out.reserve(p.size() + 32);
    bool quoted = false; // inside \Q ... \E
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (c != '\\' || i + 1 >= p.size()) {
            out += c;
            continue;
        }
        const char d = p[++i];
        if (quoted) {
            if (d == 'E') quoted = false;
            out += c;
            out += d;
        } else if (d == 's') {
            out += "\\p{White_Space}";
        } else if (d == 'S') {
            out += "\\P{White_Space}";
        } else {
            if (d == 'Q') quoted = true;
            out += c;
            out += d;
        }
    }
    return out;
}

std::string strip(std::string_view s) {
    size_t begin = 0, end = s.size();
    // Leading.
    while (begin < end) {
        int32_t cp;
        bool inc;
        const size_t n = decode_one(s, begin, &cp, &inc);
        if (cp < 0 || !is_space(static_cast<uint32_t>(cp))) break;
        begin += n;
    }
    // Trailing: walk back to each character start.
    while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
        int32_t cp;
        bool inc;
        decode_one(s, start, &cp, &inc);
        if (cp < 0 || !is_space(static_cast<uint32_t>(cp))) break;
        end = start;
    }
    return std::string(s.substr(begin, end - begin));
}

// ---------------------------------------------------------------------------

Regex::Regex(const std::string &pattern) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const std::string compiled = white_space_as_hf(pattern);
    pcre2_code *code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (code == nullptr) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        throw Error("invalid regular expression '" + pattern + "' at offset " +
                    std::to_string(offset) + ": " + reinterpret_cast<const char *>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); // falls back to the interpreter on failure
    code_ = code;
}

Regex::~Regex() {
    pcre2_code_free(static_cast<pcre2_code *>(code_));
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    auto *code = static_cast<pcre2_code *>(code_);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, nullptr);
    if (md == nullptr) throw Error("out of memory for regular expression match data");
    size_t pos = 0;
    while (pos <= s.size()) {
        const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                   PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            pcre2_match_data_free(md);
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            throw Error("regular expression '" + pattern_ +
                        "' failed: " + reinterpret_cast<const char *>(msg));
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        const size_t b = ov[0], e = ov[1];
        if (e > b) {
            out.emplace_back(b, e);
            pos = e;
        } else {
            // Empty match: step over one character.
            if (b >= s.size()) break;
            pos = b + char_len(s, b);
        }
    }
    pcre2_match_data_free(md);
    return out;
}

std::string regex_escape(std::string_view literal) {
    std::string out;
    for (char c : literal) {
        if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos || c == ' ')
            out += '\\';
        out += c;
    }
    return out;
}

} // namespace rl::core::unicode
