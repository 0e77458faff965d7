// UTF-8 helpers, Unicode normalization (utf8proc) and Unicode-aware regular
// expressions (PCRE2 with UTF + UCP) for the tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rl::core::unicode {

/// True when `s` is valid UTF-8; otherwise *bad_pos (if given) is the offset
/// of the first invalid byte.
bool valid_utf8(std::string_view s, size_t *bad_pos = nullptr);

/// Encodes one code point.
std::string encode(uint32_t cp);

/// Byte length of the UTF-8 sequence that starts at s[i] (valid input assumed).
size_t char_len(std::string_view s, size_t i);

/// Bytes -> UTF-8 with each maximal ill-formed subsequence replaced by U+FFFD
/// (what Rust's String::from_utf8_lossy and Hugging Face decoders produce).
std::string lossy(std::string_view bytes);

/// Length of the longest prefix that does not end inside a still-completable
/// UTF-8 sequence: the part a streaming decoder may emit now.
size_t emit_prefix_len(std::string_view bytes);

enum class Form { NFC, NFD, NFKC, NFKD };
/// Unicode normalization of valid UTF-8, as Hugging Face's normalizers do it:
/// utf8proc's, except that code points newer than their tables (Unicode 9.0;
/// unicode_tables.cpp) stay as they are and split the text (nothing reorders
/// or composes across them).
std::string normalize(std::string_view s, Form form);

/// True for Unicode White_Space characters (Python's str.strip set).
bool is_space(uint32_t cp);
/// Strips leading and trailing white space (Python str.strip()).
std::string strip(std::string_view s);
/// The Unicode White_Space property (Rust's char::is_whitespace, Oniguruma's
/// \s): is_space without U+001C..U+001F.
bool is_white_space(uint32_t cp);
/// The code point of the valid UTF-8 sequence at s[i].
uint32_t code_point_at(std::string_view s, size_t i);

/// A compiled PCRE2 pattern with Unicode semantics (\p{L}, \s, (?i) ...),
/// written first by pattern_as_hf so that its classes mean what they mean in
/// Hugging Face tokenizers' regex engine (Oniguruma).
/// How pattern_as_hf writes a general category: Auto as PCRE2's own property
/// plus the code points assigned to it since PCRE2's tables (when those are of
/// kBaseUnicodeVersion and no code point left the category since; PCRE2
/// matches a property far faster than a long list of ranges), else, and with
/// Explicit always, as the explicit code-point ranges of our tables.
enum class Classes { Auto, Explicit };

class Regex {
public:
    /// Throws Error naming the pattern and position on a syntax error.
    explicit Regex(const std::string &pattern, Classes classes = Classes::Auto);
    ~Regex();
    Regex(const Regex &) = delete;
    Regex &operator=(const Regex &) = delete;

    /// Non-overlapping matches [begin, end) in byte offsets, left to right.
    /// `s` must be valid UTF-8.
    std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;
    const std::string &pattern() const { return pattern_; }

private:
    std::string pattern_;
    void *code_ = nullptr; // pcre2_code_8
};

/// `pattern` as PCRE2 is given it: \s / \S as \p{White_Space} /
/// \P{White_Space} (PCRE2's UCP \s also matches U+180E MONGOLIAN VOWEL
/// SEPARATOR, not white space since Unicode 6.3); general categories (\p{L},
/// \P{Lu}, \p{^Nd}, long names such as \p{Letter}) and \d / \D (Nd) as
/// the code points of unicode_tables.cpp (the Unicode version of Hugging Face
/// `tokenizers`, newer than PCRE2's own tables; written as `classes` says),
/// inside and outside classes; outside a class they stay case-sensitive under (?i), as in
/// Oniguruma. \pL without braces is the letters "pL", as in Oniguruma. Other
/// properties (scripts, White_Space), POSIX classes, \w and \b are left to
/// PCRE2. Escaped backslashes, \Q...\E quotes and (?#...) comments are left
/// alone.
std::string pattern_as_hf(const std::string &pattern, Classes classes = Classes::Auto);

/// Escapes a literal string for use inside a PCRE2 pattern.
std::string regex_escape(std::string_view literal);

} // namespace rl::core::unicode
