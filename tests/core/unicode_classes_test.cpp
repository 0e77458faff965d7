// The tokenizer's Unicode tables (core/model/src/unicode.cpp): in regular
// expressions general categories follow our Unicode 16.0 tables (those of
// Hugging Face `tokenizers`), not PCRE2's older ones, and the rewrite keeps the
// rest of the pattern's syntax; normalization leaves code points newer than
// Hugging Face's Unicode 9.0 normalizer tables alone.
// core_tokenizer_compare_test checks every code point against Hugging Face.
#include "rl/core/error.hpp"
#include "unicode.hpp" // core/model/src

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace rl::core::unicode {
namespace {

std::vector<std::string> matches(const std::string &pattern, const std::string &text,
                                 Classes classes) {
    std::vector<std::string> out;
    for (const auto &[b, e] : Regex(pattern, classes).find_all(text))
        out.push_back(text.substr(b, e - b));
    return out;
}

class UnicodeClasses : public ::testing::TestWithParam<Classes> {};

// Kawi digits (U+11F50.., Unicode 15.0), Garay digits (U+10D40.., 16.0),
// Cyrillic TJE (U+1C89, 16.0): newer than PCRE2 10.42's Unicode 14.0 tables.
TEST_P(UnicodeClasses, CodePointsNewerThanPcre2FollowOurTables) {
    const Classes c = GetParam();
    const std::string kawi = encode(0x11F50) + encode(0x11F51) + encode(0x11F52);
    const std::string garay = encode(0x10D40) + encode(0x10D41);
    EXPECT_EQ(matches(R"(\p{N}+)", "a" + kawi + "b" + garay, c),
              (std::vector<std::string>{kawi, garay}));
    EXPECT_EQ(matches(R"(\d+)", "x" + kawi, c), std::vector<std::string>{kawi});
    EXPECT_EQ(matches(R"(\p{Nd})", encode(0x11F50), c).size(), 1u);
    EXPECT_TRUE(matches(R"(\D)", kawi, c).empty());
    // Llama-3's "anything else" class leaves them to \p{N}.
    EXPECT_EQ(matches(R"( ?[^\s\p{L}\p{N}]+|\p{N}{1,3}| )", " " + kawi, c),
              (std::vector<std::string>{" ", kawi}));
    EXPECT_EQ(matches(R"(\p{Lu})", encode(0x1C89), c), std::vector<std::string>{encode(0x1C89)});
    EXPECT_EQ(matches(R"(\p{L})", encode(0x1C89), c).size(), 1u);
    EXPECT_TRUE(matches(R"(\P{L})", encode(0x1C89), c).empty());
    EXPECT_TRUE(matches(R"([\P{L}])", encode(0x1C89), c).empty());
    EXPECT_TRUE(matches(R"(\p{^L})", encode(0x1C89), c).empty());
    EXPECT_TRUE(matches(R"(\p{Cn})", encode(0x1C89), c).empty());
    // Never assigned: unassigned on both sides.
    EXPECT_EQ(matches(R"(\p{Cn})", encode(0x0378), c).size(), 1u);
    EXPECT_TRUE(matches(R"([\p{L}\p{N}\p{P}\p{S}\p{M}\p{Z}])", encode(0x0378), c).empty());
    // Long names and loose matching.
    EXPECT_EQ(matches(R"(\p{Decimal_Number}+)", kawi, c), std::vector<std::string>{kawi});
    EXPECT_EQ(matches(R"(\p{ uppercase-letter })", encode(0x1C89), c).size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(BothWritings, UnicodeClasses,
                         ::testing::Values(Classes::Auto, Classes::Explicit));

TEST(UnicodeClassRewrite, KeepsTheRestOfThePatternsSyntax) {
    const Classes c = Classes::Auto;
    // Oniguruma knows only \p{...}: \pN is the letters "pN".
    EXPECT_EQ(matches(R"(\pN)", "1 pN", c), std::vector<std::string>{"pN"});
    // Outside a class a category stays case-sensitive under (?i), as in
    // Oniguruma; literal letters still fold.
    EXPECT_EQ(matches(R"((?i)\p{Lu}|(?i:b))", "aAbB", c),
              (std::vector<std::string>{"A", "b", "B"}));
    EXPECT_EQ(matches(R"((?i:x)\p{Lu})", "xaXA", c), std::vector<std::string>{"XA"});
    // Quoted, escaped and commented text is left alone.
    EXPECT_EQ(matches(R"(\Q\p{L}\E)", "a\\p{L}", c), std::vector<std::string>{"\\p{L}"});
    EXPECT_EQ(matches(R"(\\p{L})", "\\p{L}", c), std::vector<std::string>{"\\p{L}"});
    EXPECT_EQ(matches(R"(a(?#[\p{L})b)", "ab", c), std::vector<std::string>{"ab"});
    // Classes with a leading ']' or an escaped one, POSIX names, \s.
    EXPECT_EQ(matches(R"([]\p{N}]+)", "x]1]y", c), std::vector<std::string>{"]1]"});
    EXPECT_EQ(matches(R"([^\]\p{L}]+)", "ab]1 2c", c), std::vector<std::string>{"1 2"});
    EXPECT_EQ(matches(R"([[:digit:]\p{L}]+)", "a1 b", c), (std::vector<std::string>{"a1", "b"}));
    EXPECT_EQ(matches(R"([\s\p{N}]+)", "a1 \u180e2", c), (std::vector<std::string>{"1 ", "2"}));
    // Properties that are not general categories are PCRE2's.
    EXPECT_EQ(matches(R"(\p{Han}+)", "a\u4e16\u754cb", c),
              std::vector<std::string>{"\u4e16\u754c"});
    EXPECT_THROW(Regex(R"(\p{NoSuchProperty})"), Error);
    EXPECT_THROW(Regex(R"(\p{L)"), Error);
}

TEST(HfNormalization, CodePointsNewerThanUnicode9StayAsTheyAre) {
    // U+32FF SQUARE ERA NAME REIWA (12.1) and U+1F16C RAISED MR SIGN (12.0)
    // have compatibility decompositions since; U+11938 (13.0) is U+11935
    // U+11930 canonically; U+0898 (14.0) is a mark of class 230.
    EXPECT_EQ(normalize("x㋿y", Form::NFKC), "x㋿y");
    EXPECT_EQ(normalize("🅬", Form::NFKD), "🅬");
    EXPECT_EQ(normalize("𑤸", Form::NFD), "𑤸");
    EXPECT_EQ(normalize("𑤸", Form::NFC), "𑤸");
    EXPECT_EQ(normalize("a̴࢘", Form::NFD), "a̴࢘");
    // Around them, and in text without them, utf8proc's normalization.
    EXPECT_EQ(normalize("ﬁ ㋿ é̴", Form::NFKC), "fi ㋿ é̴");
    EXPECT_EQ(normalize("á̴", Form::NFD), "á̴");
    EXPECT_EQ(normalize("", Form::NFC), "");
}

} // namespace
} // namespace rl::core::unicode
