#include "unicode.hpp"

#include "unicode_tables.hpp"

#include "rl/core/error.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

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

namespace {

std::string utf8proc_normalize(std::string_view s, Form form) {
    if (s.empty()) return {};
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

// True for a code point Hugging Face's normalizers do not know (unassigned in
// their Unicode version).
bool unknown_to_hf_normalizers(uint32_t cp) {
    const CpRange *end = kNormalizationUnassigned + kNormalizationUnassignedCount;
    const CpRange *r = std::upper_bound(kNormalizationUnassigned, end, cp,
                                        [](uint32_t c, const CpRange &x) { return c < x.first; });
    return r != kNormalizationUnassigned && cp <= (r - 1)->last;
}

} // namespace

std::string normalize(std::string_view s, Form form) {
    // Hugging Face's normalizers have Unicode 9.0 tables: a code point newer
    // than that has no decomposition, combining class or composition there, so
    // it stays as it is and nothing reorders or composes across it. utf8proc
    // normalizes the text between such code points.
    std::string out;
    out.reserve(s.size());
    size_t begin = 0, i = 0;
    while (i < s.size()) {
        const auto b = static_cast<uint8_t>(s[i]);
        if (b < 0x80) {
            ++i;
            continue;
        }
        const size_t n = char_len(s, i);
        if (unknown_to_hf_normalizers(code_point_at(s, i))) {
            out += utf8proc_normalize(s.substr(begin, i - begin), form);
            out.append(s.substr(i, n));
            begin = i + n;
        }
        i += n;
    }
    if (begin == 0) return utf8proc_normalize(s, form);
    out += utf8proc_normalize(s.substr(begin), form);
    return out;
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

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t bit(Gc g) {
    return 1u << static_cast<unsigned>(g);
}

// The general categories a property name stands for (short and long names,
// compared as Oniguruma and PCRE2 do: case, spaces, '_' and '-' ignored), or
// 0 when the name is not a general category (scripts, White_Space, and POSIX
// names such as Punct or Digit, which Oniguruma defines otherwise).
uint32_t gc_mask(std::string_view name) {
    std::string k;
    for (char c : name) {
        if (c == ' ' || c == '_' || c == '-') continue;
        k += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    using G = Gc;
    const uint32_t lc = bit(G::Lu) | bit(G::Ll) | bit(G::Lt);
    const uint32_t l = lc | bit(G::Lm) | bit(G::Lo);
    const uint32_t m = bit(G::Mn) | bit(G::Mc) | bit(G::Me);
    const uint32_t n = bit(G::Nd) | bit(G::Nl) | bit(G::No);
    const uint32_t p =
        bit(G::Pc) | bit(G::Pd) | bit(G::Ps) | bit(G::Pe) | bit(G::Pi) | bit(G::Pf) | bit(G::Po);
    const uint32_t s = bit(G::Sm) | bit(G::Sc) | bit(G::Sk) | bit(G::So);
    const uint32_t z = bit(G::Zs) | bit(G::Zl) | bit(G::Zp);
    const uint32_t c = bit(G::Cc) | bit(G::Cf) | bit(G::Cs) | bit(G::Co) | bit(G::Cn);
    static const std::pair<const char *, uint32_t> kNames[] = {
        {"l", l},
        {"letter", l},
        {"lc", lc},
        {"l&", lc},
        {"casedletter", lc},
        {"lu", bit(G::Lu)},
        {"uppercaseletter", bit(G::Lu)},
        {"ll", bit(G::Ll)},
        {"lowercaseletter", bit(G::Ll)},
        {"lt", bit(G::Lt)},
        {"titlecaseletter", bit(G::Lt)},
        {"lm", bit(G::Lm)},
        {"modifierletter", bit(G::Lm)},
        {"lo", bit(G::Lo)},
        {"otherletter", bit(G::Lo)},
        {"m", m},
        {"mark", m},
        {"combiningmark", m},
        {"mn", bit(G::Mn)},
        {"nonspacingmark", bit(G::Mn)},
        {"mc", bit(G::Mc)},
        {"spacingmark", bit(G::Mc)},
        {"me", bit(G::Me)},
        {"enclosingmark", bit(G::Me)},
        {"n", n},
        {"number", n},
        {"nd", bit(G::Nd)},
        {"decimalnumber", bit(G::Nd)},
        {"nl", bit(G::Nl)},
        {"letternumber", bit(G::Nl)},
        {"no", bit(G::No)},
        {"othernumber", bit(G::No)},
        {"p", p},
        {"punctuation", p},
        {"pc", bit(G::Pc)},
        {"connectorpunctuation", bit(G::Pc)},
        {"pd", bit(G::Pd)},
        {"dashpunctuation", bit(G::Pd)},
        {"ps", bit(G::Ps)},
        {"openpunctuation", bit(G::Ps)},
        {"pe", bit(G::Pe)},
        {"closepunctuation", bit(G::Pe)},
        {"pi", bit(G::Pi)},
        {"initialpunctuation", bit(G::Pi)},
        {"pf", bit(G::Pf)},
        {"finalpunctuation", bit(G::Pf)},
        {"po", bit(G::Po)},
        {"otherpunctuation", bit(G::Po)},
        {"s", s},
        {"symbol", s},
        {"sm", bit(G::Sm)},
        {"mathsymbol", bit(G::Sm)},
        {"sc", bit(G::Sc)},
        {"currencysymbol", bit(G::Sc)},
        {"sk", bit(G::Sk)},
        {"modifiersymbol", bit(G::Sk)},
        {"so", bit(G::So)},
        {"othersymbol", bit(G::So)},
        {"z", z},
        {"separator", z},
        {"zs", bit(G::Zs)},
        {"spaceseparator", bit(G::Zs)},
        {"zl", bit(G::Zl)},
        {"lineseparator", bit(G::Zl)},
        {"zp", bit(G::Zp)},
        {"paragraphseparator", bit(G::Zp)},
        {"c", c},
        {"other", c},
        {"cc", bit(G::Cc)},
        {"control", bit(G::Cc)},
        {"cf", bit(G::Cf)},
        {"format", bit(G::Cf)},
        {"cs", bit(G::Cs)},
        {"surrogate", bit(G::Cs)},
        {"co", bit(G::Co)},
        {"privateuse", bit(G::Co)},
        {"cn", bit(G::Cn)},
        {"unassigned", bit(G::Cn)},
    };
    for (const auto &[key, mask] : kNames)
        if (k == key) return mask;
    return 0;
}

constexpr uint32_t kAllCategories = (1u << 30) - 1;

// The code points of the categories in `mask` as sorted, merged ranges without
// the surrogates U+D800..DFFF (not characters in UTF-8; PCRE2 refuses them in
// a UTF pattern).
Ranges gc_ranges(uint32_t mask) {
    Ranges out;
    auto add = [&](uint32_t a, uint32_t b) {
        if (!out.empty() && out.back().second + 1 == a)
            out.back().second = b;
        else
            out.emplace_back(a, b);
    };
    for (size_t i = 0; i < kGcRunCount; ++i) {
        const uint32_t a = kGcRuns[i].first;
        const uint32_t b = i + 1 < kGcRunCount ? kGcRuns[i + 1].first - 1 : 0x10FFFF;
        if ((mask & bit(kGcRuns[i].gc)) == 0) continue;
        if (b < 0xD800 || a > 0xDFFF) {
            add(a, b);
            continue;
        }
        if (a < 0xD800) add(a, 0xD7FF);
        if (b > 0xDFFF) add(0xE000, b);
    }
    return out;
}

// True when PCRE2's own tables are of kBaseUnicodeVersion, so that
// kBaseDiffs says where they differ from ours.
bool pcre2_tables_are_base() {
    static const bool same = [] {
        char version[64] = {};
        return pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version) > 0 &&
               std::strcmp(version, kBaseUnicodeVersion) == 0;
    }();
    return same;
}

// The code points that belong to the categories of `mask` in our tables but
// not in the base version's, into *added; false when some code point belongs
// in the base version only (then PCRE2's property cannot be a starting point).
bool base_additions(uint32_t mask, Ranges *added) {
    for (size_t d = 0; d < kBaseDiffCount; ++d) {
        const BaseDiff &diff = kBaseDiffs[d];
        const bool in_base = (mask & bit(diff.gc)) != 0;
        // The runs of our tables that overlap [first, last].
        size_t i = static_cast<size_t>(
            std::upper_bound(kGcRuns, kGcRuns + kGcRunCount, diff.first,
                             [](uint32_t cp, const GcRun &r) { return cp < r.first; }) -
            kGcRuns - 1);
        for (; i < kGcRunCount && kGcRuns[i].first <= diff.last; ++i) {
            const uint32_t a = std::max(diff.first, kGcRuns[i].first);
            const uint32_t b =
                std::min(diff.last, i + 1 < kGcRunCount ? kGcRuns[i + 1].first - 1 : 0x10FFFFu);
            const bool in_ours = (mask & bit(kGcRuns[i].gc)) != 0;
            if (in_base && !in_ours) return false;
            if (!in_ours || in_base) continue;
            if (!added->empty() && added->back().second + 1 == a)
                added->back().second = b;
            else
                added->emplace_back(a, b);
        }
    }
    return true;
}

// PCRE2 property items for the categories of `mask`: \p{L} where all letters
// are in, else \p{Lu} ...
std::string pcre2_properties(uint32_t mask) {
    static const char *const kLeaf[30] = {
        "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
        "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"};
    static const std::pair<const char *, std::pair<Gc, Gc>> kMajor[] = {
        {"L", {Gc::Lu, Gc::Lo}}, {"M", {Gc::Mn, Gc::Me}}, {"N", {Gc::Nd, Gc::No}},
        {"P", {Gc::Pc, Gc::Po}}, {"S", {Gc::Sm, Gc::So}}, {"Z", {Gc::Zs, Gc::Zp}},
        {"C", {Gc::Cc, Gc::Cn}}};
    std::string out;
    for (const auto &[name, span] : kMajor) {
        const uint32_t major = (bit(span.second) << 1) - bit(span.first);
        if ((mask & major) != major) continue;
        out += std::string("\\p{") + name + "}";
        mask &= ~major;
    }
    for (unsigned g = 0; g < 30; ++g)
        if (mask & (1u << g)) out += std::string("\\p{") + kLeaf[g] + "}";
    return out;
}

// Class items for `ranges`: \x{A}-\x{B} ...
void append_ranges(std::string &out, const Ranges &ranges) {
    char buf[40];
    for (const auto &[a, b] : ranges) {
        if (a == b)
            std::snprintf(buf, sizeof buf, "\\x{%X}", a);
        else if (a + 1 == b)
            std::snprintf(buf, sizeof buf, "\\x{%X}\\x{%X}", a, b);
        else
            std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", a, b);
        out += buf;
    }
}

} // namespace

std::string pattern_as_hf(const std::string &p, Classes classes) {
    const bool compact = classes == Classes::Auto && pcre2_tables_are_base();
    std::string out;
    bool caseless = false;            // (?i) in force here
    std::vector<bool> outer_caseless; // at each open group
    out.reserve(p.size() + 32);
    bool quoted = false;      // inside \Q ... \E
    bool in_class = false;    // inside [ ... ]
    bool class_first = false; // at the first item of a class, where ']' is literal
    // A category set written in place of an escape: a class of its own outside
    // a class (kept case-sensitive: Oniguruma does not fold \p{Lu} under (?i)),
    // its ranges inside one.
    auto emit = [&](uint32_t mask, bool negate, std::string_view original) {
        // Inside a class the set itself (a negation as the other categories),
        // outside a class a class of its own, negated for \P.
        const uint32_t m = in_class && negate ? kAllCategories & ~mask : mask;
        std::string items;
        Ranges added;
        if (compact && base_additions(m, &added)) {
            items = pcre2_properties(m);
            append_ranges(items, added);
        } else {
            const Ranges r = gc_ranges(m);
            if (r.empty()) {
                out += original; // \p{Cs}: nothing in UTF-8 either way
                return;
            }
            append_ranges(items, r);
        }
        if (in_class) {
            out += items;
            return;
        }
        out += caseless ? "(?-i:[" : "[";
        if (negate) out += '^';
        out += items;
        out += caseless ? "])" : "]";
    };
    for (size_t i = 0; i < p.size(); ++i) {
        const char c = p[i];
        if (quoted) {
            if (c == '\\' && i + 1 < p.size() && p[i + 1] == 'E') {
                quoted = false;
                out += "\\E";
                ++i;
            } else {
                out += c;
            }
            continue;
        }
        if (c == '\\' && i + 1 < p.size()) {
            const char d = p[++i];
            class_first = false;
            if (d == 'Q') {
                quoted = true;
                out += "\\Q";
            } else if (d == 's' || d == 'S') {
                out += d == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
            } else if (d == 'd' || d == 'D') {
                emit(bit(Gc::Nd), d == 'D', d == 'd' ? "\\d" : "\\D");
            } else if ((d == 'p' || d == 'P') && (i + 1 >= p.size() || p[i + 1] != '{')) {
                out += d; // Oniguruma knows only \p{...}: \pL is the letters "pL"
            } else if (d == 'p' || d == 'P') {
                // \p{Name} / \p{^Name}.
                const size_t begin = i - 1;
                const size_t end = p.find('}', i + 2);
                if (end == std::string::npos) {
                    out += p.substr(begin); // PCRE2 reports the error
                    break;
                }
                const std::string name = p.substr(i + 2, end - i - 2);
                bool negate = d == 'P';
                std::string_view bare = name;
                if (!bare.empty() && bare[0] == '^') {
                    negate = !negate;
                    bare.remove_prefix(1);
                }
                const std::string original = p.substr(begin, end + 1 - begin);
                const uint32_t mask = gc_mask(bare);
                if (mask == 0)
                    out += original; // not a general category: PCRE2's own tables
                else
                    emit(mask, negate, original);
                i = end;
            } else if (d == 'c' && i + 1 < p.size()) {
                out += "\\c";
                out += p[++i]; // \cX: X is not syntax
            } else {
                out += c;
                out += d;
            }
            continue;
        }
        if (in_class) {
            if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
                // POSIX [:name:] inside a class.
                const size_t end = p.find(":]", i + 2);
                if (end != std::string::npos) {
                    out += p.substr(i, end + 2 - i);
                    i = end + 1;
                    class_first = false;
                    continue;
                }
            }
            if (c == ']' && !class_first) in_class = false;
            class_first = false;
            out += c;
            continue;
        }
        if (c == '[') {
            in_class = true;
            class_first = true;
            out += c;
            if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
            continue;
        }
        if (c == '(' && p.compare(i, 3, "(?#") == 0) {
            const size_t end = p.find(')', i);
            const size_t stop = end == std::string::npos ? p.size() : end + 1;
            out += p.substr(i, stop - i);
            i = stop - 1;
            continue;
        }
        if (c == '(') {
            // (?flags) sets options to the end of the group, (?flags:...) inside it.
            outer_caseless.push_back(caseless);
            if (i + 1 < p.size() && p[i + 1] == '?') {
                size_t k = i + 2;
                bool on = true, ci = caseless;
                for (; k < p.size() && (std::isalpha(static_cast<unsigned char>(p[k])) ||
                                        p[k] == '-' || p[k] == '^');
                     ++k) {
                    if (p[k] == '-') on = false;
                    if (p[k] == '^') ci = false;
                    if (p[k] == 'i') ci = on;
                }
                if (k < p.size() && (p[k] == ')' || p[k] == ':') && k > i + 2) {
                    caseless = ci;
                    if (p[k] == ')') outer_caseless.pop_back();
                }
            }
        } else if (c == ')' && !outer_caseless.empty()) {
            caseless = outer_caseless.back();
            outer_caseless.pop_back();
        }
        out += c;
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

Regex::Regex(const std::string &pattern, Classes classes) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const std::string compiled = pattern_as_hf(pattern, classes);
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
