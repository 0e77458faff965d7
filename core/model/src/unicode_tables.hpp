// The General_Category of every code point at the Unicode version Hugging Face
// `tokenizers` follows, where an older version (PCRE2's) differs, and what
// Hugging Face's normalizers do not know (generated:
// scripts/gen_unicode_tables.py writes unicode_tables.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace rl::core::unicode {

/// The 30 general categories; Cn also covers never-assigned code points.
enum class Gc : uint8_t {
    Lu,
    Ll,
    Lt,
    Lm,
    Lo,
    Mn,
    Mc,
    Me,
    Nd,
    Nl,
    No,
    Pc,
    Pd,
    Ps,
    Pe,
    Pi,
    Pf,
    Po,
    Sm,
    Sc,
    Sk,
    So,
    Zs,
    Zl,
    Zp,
    Cc,
    Cf,
    Cs,
    Co,
    Cn,
};

/// A run of code points [first, next run's first) of one category.
struct GcRun {
    uint32_t first;
    Gc gc;
};

/// Runs in code point order, the first at U+0000, the last ending at U+10FFFF.
extern const GcRun kGcRuns[];
extern const size_t kGcRunCount;
/// The Unicode version of the tables, e.g. "16.0.0".
extern const char kTablesUnicodeVersion[];

/// Code points [first, last] whose category in kBaseUnicodeVersion (that of
/// PCRE2's own tables in the PCRE2 we build against) was `gc`, not the one of
/// kGcRuns; in code point order.
struct BaseDiff {
    uint32_t first, last;
    Gc gc;
};
extern const BaseDiff kBaseDiffs[];
extern const size_t kBaseDiffCount;
extern const char kBaseUnicodeVersion[];

/// Code points [first, last].
struct CpRange {
    uint32_t first, last;
};
/// The code points unassigned in kNormalizationUnicodeVersion (9.0.0), the
/// version of Hugging Face's normalizer tables, in code point order.
extern const CpRange kNormalizationUnassigned[];
extern const size_t kNormalizationUnassignedCount;
extern const char kNormalizationUnicodeVersion[];

} // namespace rl::core::unicode
