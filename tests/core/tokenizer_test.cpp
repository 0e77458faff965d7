// Byte-level BPE tokenizer.json: merges, pre-tokenizer regexes, added and
// special tokens, Unicode round trips, streaming decode, malformed files.
#include "rl/core/error.hpp"
#include "rl/core/tiny.hpp"
#include "rl/core/tokenizer.hpp"
#include "test_util.hpp"

#include <nlohmann/json.hpp>

#include <random>

namespace rl::core {
namespace {

using Json = nlohmann::ordered_json;
using test::error_of;

const char *kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char *kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
    std::string s;
    if (cp < 0x80)
        s += char(cp);
    else if (cp < 0x800)
        s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
    else
        s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)),
            s += char(0x80 | (cp & 0x3F));
    return s;
}

// GPT-2's byte -> character table, written out independently of the library.
std::string byte_char(int b) {
    std::vector<int> printable;
    for (int x = '!'; x <= '~'; ++x) printable.push_back(x);
    for (int x = 0xA1; x <= 0xAC; ++x) printable.push_back(x);
    for (int x = 0xAE; x <= 0xFF; ++x) printable.push_back(x);
    if (std::find(printable.begin(), printable.end(), b) != printable.end()) return utf8(b);
    int n = 0;
    for (int x = 0; x < b; ++x)
        if (std::find(printable.begin(), printable.end(), x) == printable.end()) ++n;
    return utf8(256 + n);
}

// A byte-level BPE: ids 0..255 are the bytes, then one id per merge result.
struct Spec {
    std::vector<std::pair<std::string, std::string>> merges; // in byte-level form
    Json pre_tokenizer;
    Json normalizer = nullptr;
    Json added = Json::array();
    Json post_processor = nullptr;
    bool ignore_merges = false;
};

std::string bl(const std::string &raw) {
    std::string s;
    for (unsigned char c : raw) s += byte_char(c);
    return s;
}

Json pre(const char *regex) {
    if (regex == nullptr)
        return Json{{"type", "ByteLevel"},
                    {"add_prefix_space", false},
                    {"trim_offsets", true},
                    {"use_regex", true}};
    return Json{{"type", "Sequence"},
                {"pretokenizers",
                 {Json{{"type", "Split"},
                       {"pattern", {{"Regex", regex}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                  Json{{"type", "ByteLevel"},
                       {"add_prefix_space", false},
                       {"trim_offsets", false},
                       {"use_regex", false}}}}};
}

// The tiny model's tokenizer.json, for the fields a byte-level BPE file has,
// with the spec's vocabulary (the bytes from the table above, then one id per
// merge result), merges, added tokens and pre- and post-processing.
Json make_json(const Spec &s) {
    Json vocab = Json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
    Json merges = Json::array();
    int next = 256;
    for (const auto &[a, b] : s.merges) {
        merges.push_back(a + " " + b);
        if (!vocab.contains(a + b)) vocab[a + b] = next++;
    }
    Json j = Json::parse(tiny_tokenizer_json());
    j.update({{"added_tokens", s.added},
              {"normalizer", s.normalizer},
              {"pre_tokenizer", s.pre_tokenizer},
              {"post_processor", s.post_processor},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}}});
    j["model"].update({{"ignore_merges", s.ignore_merges}, {"vocab", vocab}, {"merges", merges}});
    return j;
}

std::shared_ptr<Tokenizer> make(const Spec &s) {
    return Tokenizer::from_json(make_json(s).dump(), "hand.json");
}

Json added_token(int id, const std::string &content, bool special, bool lstrip = false,
                 bool rstrip = false, bool single_word = false) {
    return Json{{"id", id},          {"content", content}, {"single_word", single_word},
                {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", false},
                {"special", special}};
}

using Ids = std::vector<int32_t>;

TEST(Tokenizer, HandMadeMergesProduceKnownIds) {
    Spec s;
    s.pre_tokenizer = pre(nullptr); // GPT-2 ByteLevel with its regex
    // ids: ab=256, abc=257, Ġa=258, Ġabc=259
    s.merges = {{"a", "b"}, {"ab", "c"}, {bl(" "), "a"}, {bl(" "), "abc"}};
    auto t = make(s);
    EXPECT_EQ(t->encode("abc abc"), (Ids{257, 259}));
    // (a,b) outranks (Ġ,a): the lowest rank merges first, not the leftmost pair.
    EXPECT_EQ(t->encode(" ab"), (Ids{32, 256}));
    EXPECT_EQ(t->encode(" a"), (Ids{258}));
    EXPECT_EQ(t->encode("cab"), (Ids{'c', 256}));
    EXPECT_EQ(t->encode(""), Ids{});
    EXPECT_EQ(t->token_to_id(bl(" ") + "abc"), 259);
    EXPECT_EQ(t->id_to_token(258), bl(" ") + "a");
    EXPECT_EQ(t->decode({257, 259, 32, 256}), "abc abc ab");
}

TEST(Tokenizer, MergesAlsoAcceptThePairListFormat) {
    Json j = make_json(Spec{{}, pre(nullptr)});
    j["model"]["vocab"]["xy"] = 256;
    j["model"]["merges"] = Json::array({Json::array({"x", "y"})});
    auto t = Tokenizer::from_json(j.dump());
    EXPECT_EQ(t->encode("xyx"), (Ids{256, 'x'}));
}

TEST(Tokenizer, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
    Spec s;
    s.pre_tokenizer = pre(kLlama3);
    s.merges = {{"a", "b"}, {"c", "d"}, {"b", "c"}, {"bc", "d"}, {"a", "bcd"}}; // ..., abcd = 260
    // With merges: a b c d -> ab cd (no "ab cd" merge) = [256, 257].
    EXPECT_EQ(make(s)->encode("abcd"), (Ids{256, 257}));
    s.ignore_merges = true;
    EXPECT_EQ(make(s)->encode("abcd"), (Ids{260}));
}

TEST(Tokenizer, PreTokenizerRegexesSplitLikeTheirModels) {
    Spec s;
    // 34 merges first: it only forms when 3 and 4 are in the same piece.
    s.merges = {{"3", "4"}, {"1", "2"}, {"12", "3"}, {"4", "5"}, {"'", "M"}};
    // ids: 34=256, 12=257, 123=258, 45=259, 'M=260
    s.pre_tokenizer = pre(nullptr);
    EXPECT_EQ(make(s)->encode("12345"), (Ids{257, 256, '5'})); // GPT-2: one number piece
    EXPECT_EQ(make(s)->encode("I'M"), (Ids{'I', '\'', 'M'}));  // contractions are case-sensitive
    s.pre_tokenizer = pre(kLlama3);
    EXPECT_EQ(make(s)->encode("12345"), (Ids{258, 259})); // digits in groups of three
    EXPECT_EQ(make(s)->encode("I'M"), (Ids{'I', 260}));   // (?i:'m)
    s.pre_tokenizer = pre(kQwen2);
    EXPECT_EQ(make(s)->encode("12345"), (Ids{'1', '2', '3', '4', '5'})); // single digits
}

TEST(Tokenizer, SplitBehaviorsAndDigitsPreTokenizer) {
    Spec s;
    s.merges = {{"a", "-"}, {"-", "b"}};
    auto with = [&](const std::string &behavior) {
        s.pre_tokenizer = Json{
            {"type", "Sequence"},
            {"pretokenizers",
             {Json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}},
              Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
        return make(s)->encode("a-b");
    };
    EXPECT_EQ(with("Isolated"), (Ids{'a', '-', 'b'}));
    EXPECT_EQ(with("Removed"), (Ids{'a', 'b'}));
    EXPECT_EQ(with("MergedWithPrevious"), (Ids{256, 'b'}));
    EXPECT_EQ(with("MergedWithNext"), (Ids{'a', 257}));
    s.merges = {{"1", "2"}};
    s.pre_tokenizer =
        Json{{"type", "Sequence"},
             {"pretokenizers",
              {Json{{"type", "Digits"}, {"individual_digits", true}},
               Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    EXPECT_EQ(make(s)->encode("x12"), (Ids{'x', '1', '2'}));
}

TEST(Tokenizer, AddPrefixSpaceAddsOneSpace) {
    Spec s;
    s.pre_tokenizer = Json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
    auto t = make(s);
    EXPECT_EQ(t->encode("hi"), (Ids{' ', 'h', 'i'}));
    EXPECT_EQ(t->encode(" hi"), (Ids{' ', 'h', 'i'}));
}

class RoundTrip : public ::testing::TestWithParam<const char *> {};

const std::vector<std::string> &unicode_samples() {
    static const std::vector<std::string> s = {
        "Hello, world! It's 2024; we'll see.",
        "漢字かな交じり文と中文测试，还有한국어。",
        "emoji: 👩‍👩‍👧‍👦 family 🎉🏳️‍🌈 flags 🇫🇷 skin 👍🏽",
        "combining: n\xcc\x83 a\xcc\x8a\xcc\xa3 "
        "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87",
        "whitespace:  a  \t\n\n   b   \r\n\t \xc2\xa0\xe3\x80\x80"
        "end   ",
        "RTL \xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 mixed",
        std::string("nul\0byte and \xef\xbb\xbf BOM", sizeof("nul\0byte and \xef\xbb\xbf BOM") - 1),
        "code: for (int i = 0; i < n; ++i) { x[i] = 1e-3 * y; } // done\n\n\n",
        "    ",
        "\n",
    };
    return s;
}

TEST_P(RoundTrip, UnicodeTextDecodesToItself) {
    Spec s;
    const std::string which = GetParam();
    s.pre_tokenizer = which == "gpt2"     ? pre(nullptr)
                      : which == "llama3" ? pre(kLlama3)
                                          : pre(kQwen2);
    s.merges = {
        {bl(" "), "t"}, {"h", "e"}, {bl(" "), "a"}, {bl("\xe4"), bl("\xb8")}, {bl("\n"), bl("\n")}};
    auto t = make(s);
    for (const auto &text : unicode_samples()) {
        const Ids ids = t->encode(text);
        EXPECT_EQ(t->decode(ids), text) << which << ": " << text;
    }
}

INSTANTIATE_TEST_SUITE_P(Regexes, RoundTrip, ::testing::Values("gpt2", "llama3", "qwen2"));

TEST(Tokenizer, NfcNormalizerComposesCombiningMarks) {
    Spec s;
    s.pre_tokenizer = pre(kQwen2);
    s.normalizer = Json{{"type", "NFC"}};
    auto t = make(s);
    EXPECT_EQ(t->decode(t->encode("e\xcc\x81")), "\xc3\xa9"); // e + U+0301 -> é
    EXPECT_EQ(t->encode("e\xcc\x81"), (Ids{0xC3, 0xA9}));
    EXPECT_EQ(t->decode(t->encode("\xea\xb0\x80")), "\xea\xb0\x80"); // precomposed Hangul stays
    for (const auto &text : unicode_samples()) {
        const std::string back = t->decode(t->encode(text));
        EXPECT_EQ(t->decode(t->encode(back)), back); // NFC is idempotent
    }
}

TEST(Tokenizer, TinyTokenizerRoundTripsArbitraryBytesAsText) {
    auto t = Tokenizer::from_json(tiny_tokenizer_json(), "tiny");
    for (const auto &text : unicode_samples()) {
        const Ids ids = t->encode(text);
        EXPECT_EQ(ids.size(), text.size()); // one token per byte
        EXPECT_EQ(t->decode(ids), text);
    }
}

TEST(Tokenizer, AddedAndSpecialTokensAreMatchedBeforeBpe) {
    Spec s;
    s.pre_tokenizer = pre(kQwen2);
    s.added =
        Json::array({added_token(300, "<|im_start|>", true), added_token(301, "<|im_end|>", true),
                     added_token(302, "<|im", false), added_token(303, "<tool>", false),
                     added_token(304, "[L]", true, /*lstrip=*/true),
                     added_token(305, "[R]", true, false, /*rstrip=*/true),
                     added_token(306, "cat", false, false, false, /*single_word=*/true)});
    auto t = make(s);
    EXPECT_EQ(t->encode("<|im_start|>user\nhi<|im_end|>"),
              (Ids{300, 'u', 's', 'e', 'r', '\n', 'h', 'i', 301}));
    // Longest match wins over the shorter added token "<|im".
    EXPECT_EQ(t->encode("<|im<|im_end|>"), (Ids{302, 301}));
    // Without special parsing, specials are text; non-special added tokens still match.
    EncodeOptions plain;
    plain.parse_special = false;
    const Ids as_text = t->encode("<|im_end|><tool>", plain);
    EXPECT_EQ(as_text.back(), 303);
    EXPECT_EQ(t->decode(Ids(as_text.begin(), as_text.end() - 1)), "<|im_end|>");
    EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 301), 0);
    // lstrip / rstrip swallow the white space next to the token.
    EXPECT_EQ(t->encode("a  [L]b"), (Ids{'a', 304, 'b'}));
    EXPECT_EQ(t->encode("a[R] \n b"), (Ids{'a', 305, 'b'}));
    // single_word: only as a whole word.
    EXPECT_EQ(t->encode("a cat"), (Ids{'a', ' ', 306}));
    EXPECT_EQ(t->encode("cats"), (Ids{'c', 'a', 't', 's'}));
    // Decoding: specials can be skipped.
    EXPECT_EQ(t->decode({300, 'h', 'i', 301}), "<|im_start|>hi<|im_end|>");
    EXPECT_EQ(t->decode({300, 'h', 'i', 301}, /*skip_special_tokens=*/true), "hi");
    EXPECT_TRUE(t->is_special(300));
    EXPECT_FALSE(t->is_special(303));
    EXPECT_EQ(t->token_to_id("<|im_end|>"), 301);
    EXPECT_EQ(t->vocab_size(), 307);
}

TEST(Tokenizer, TemplatePostProcessorAddsBosWhenAsked) {
    Spec s;
    s.pre_tokenizer = pre(kLlama3);
    s.added = Json::array({added_token(400, "<|begin_of_text|>", true)});
    s.post_processor =
        Json{{"type", "Sequence"},
             {"processors",
              {Json{{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", false},
                    {"use_regex", true}},
               Json{{"type", "TemplateProcessing"},
                    {"single",
                     {Json{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                      Json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                    {"pair", Json::array()},
                    {"special_tokens",
                     {{"<|begin_of_text|>",
                       {{"id", "<|begin_of_text|>"},
                        {"ids", {400}},
                        {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
    auto t = make(s);
    EncodeOptions o;
    o.add_special_tokens = true;
    EXPECT_EQ(t->encode("hi", o), (Ids{400, 'h', 'i'}));
    EXPECT_EQ(t->encode("hi"), (Ids{'h', 'i'}));
}

TEST(Tokenizer, IllFormedBytesDecodeToReplacementCharacters) {
    auto t = Tokenizer::from_json(tiny_tokenizer_json(), "tiny");
    const std::string fffd = "\xef\xbf\xbd";
    EXPECT_EQ(t->decode({0xFF}), fffd);
    EXPECT_EQ(t->decode({0xE4, 0xBD}), fffd); // one maximal subpart
    EXPECT_EQ(t->decode({0xE4, 'A'}), fffd + "A");
    EXPECT_EQ(t->decode({0xED, 0xA0, 0x80}), fffd + fffd + fffd); // surrogate: each byte
    EXPECT_EQ(t->decode({0xE4, 0xBD, 0xA0}), "\xe4\xbd\xa0");
}

TEST(StreamDecoder, HoldsSplitCharactersUntilComplete) {
    auto t = Tokenizer::from_json(tiny_tokenizer_json(), "tiny");
    StreamDecoder d(t);
    EXPECT_EQ(d.push('a'), "a");
    EXPECT_EQ(d.push(0xE4), "");
    EXPECT_EQ(d.push(0xBD), "");
    EXPECT_EQ(d.push(0xA0), "\xe4\xbd\xa0");
    EXPECT_EQ(d.push(0xF0), "");
    EXPECT_EQ(d.push('x'), "\xef\xbf\xbdx"); // the F0 can no longer complete
    EXPECT_EQ(d.push(0xF0), "");
    EXPECT_EQ(d.finish(), "\xef\xbf\xbd");
    StreamDecoder skip(t, /*skip_special_tokens=*/true);
    EXPECT_EQ(skip.push(kTinyImStart), "");
    StreamDecoder keep(t);
    EXPECT_EQ(keep.push(kTinyImStart), "<|im_start|>");
}

TEST(StreamDecoder, ConcatenationEqualsDecodeForRandomIds) {
    auto t = Tokenizer::from_json(tiny_tokenizer_json(), "tiny");
    std::mt19937 rng(3);
    for (int iter = 0; iter < 300; ++iter) {
        Ids ids;
        const int n = 1 + static_cast<int>(rng() % 30);
        for (int i = 0; i < n; ++i) {
            // Bias towards UTF-8 lead and continuation bytes.
            const uint32_t r = rng() % 10;
            ids.push_back(static_cast<int32_t>(r < 3   ? 0x80 + rng() % 64
                                               : r < 6 ? 0xC0 + rng() % 64
                                                       : rng() % kTinyVocabSize));
        }
        StreamDecoder d(t);
        std::string streamed;
        for (int32_t id : ids) streamed += d.push(id);
        streamed += d.finish();
        ASSERT_EQ(streamed, t->decode(ids));
    }
}

TEST(Tokenizer, BadInputsAreErrors) {
    auto t = Tokenizer::from_json(tiny_tokenizer_json(), "tiny");
    EXPECT_NE(error_of([&] { t->encode("ok \xff bad"); }).find("not valid UTF-8 (byte 3)"),
              std::string::npos);
    EXPECT_NE(error_of([&] { t->decode({5000}); }).find("token id 5000"), std::string::npos);
    EXPECT_NE(error_of([&] { t->decode({-1}); }).find("token id -1"), std::string::npos);
    EXPECT_NE(error_of([&] { t->id_to_token(999); }).find("999"), std::string::npos);
}

TEST(Tokenizer, LongInputsEncodeQuicklyAndRoundTrip) {
    Spec s;
    s.pre_tokenizer = pre(kLlama3);
    s.merges = {{"a", "a"}, {"aa", "aa"}, {"aaaa", "aaaa"}, {bl(" "), bl(" ")}};
    auto t = make(s);
    std::mt19937 rng(1);
    std::string text(std::string(5000, 'a') + std::string(3000, ' ') + "x");
    for (int i = 0; i < 100000; ++i) text += "ab c\n\t"[rng() % 6];
    const Ids ids = t->encode(text);
    EXPECT_EQ(t->decode(ids), text);
    EXPECT_LT(ids.size(), text.size());
}

struct BadJson {
    std::string what;
    std::function<void(Json &)> edit;
    std::string expect;
};

TEST(Tokenizer, MalformedFilesAreErrorsNamingTheKey) {
    Spec base;
    base.pre_tokenizer = pre(kQwen2);
    base.merges = {{"a", "b"}};
    // An edit that sets the top-level `key` to `value`.
    auto set = [](const char *key, const Json &value) {
        return [key, value](Json &j) { j[key] = value; };
    };
    const std::vector<BadJson> cases = {
        {"merge of unknown token", [](Json &j) { j["model"]["merges"].push_back("zz q"); },
         "model.merges[1]"},
        {"merge result missing", [](Json &j) { j["model"]["merges"].push_back("c d"); }, "'cd'"},
        {"merge format", [](Json &j) { j["model"]["merges"].push_back("abc"); }, "model.merges[1]"},
        {"wordpiece", [](Json &j) { j["model"]["type"] = "WordPiece"; }, "'model.type'"},
        {"no model", [](Json &j) { j.erase("model"); }, "'model'"},
        {"vocab id string", [](Json &j) { j["model"]["vocab"]["q"] = "1"; }, "model.vocab['q']"},
        {"vocab duplicate id", [](Json &j) { j["model"]["vocab"]["qq"] = 5; }, "reuses id 5"},
        {"byte fallback", [](Json &j) { j["model"]["byte_fallback"] = true; },
         "'model.byte_fallback'"},
        {"dropout", [](Json &j) { j["model"]["dropout"] = 0.1; }, "'model.dropout'"},
        {"suffix", [](Json &j) { j["model"]["end_of_word_suffix"] = "</w>"; },
         "end_of_word_suffix"},
        {"unknown pre-tokenizer",
         [](Json &j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Whitespace"; },
         "'pre_tokenizer.pretokenizers[0].type'"},
        {"bad regex",
         [](Json &j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed"; },
         "'pre_tokenizer.pretokenizers[0].pattern'"},
        {"bad behavior",
         [](Json &j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
         ".behavior'"},
        {"not byte level",
         set("pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", Json::array()}}),
         "no ByteLevel"},
        {"normalizer", set("normalizer", {{"type", "Lowercase"}}), "'normalizer.type'"},
        {"decoder", set("decoder", {{"type", "WordPiece"}}), "'decoder.type'"},
        {"post processor", set("post_processor", {{"type", "BertProcessing"}}),
         "'post_processor.type'"},
        {"added id", set("added_tokens", Json::array({Json{{"id", -3}, {"content", "x"}}})),
         "'added_tokens[0].id'"},
        {"added content", set("added_tokens", Json::array({Json{{"id", 300}, {"content", ""}}})),
         "'added_tokens[0].content'"},
        {"added duplicate",
         set("added_tokens",
             Json::array({added_token(300, "<a>", true), added_token(301, "<a>", true)})),
         "'added_tokens[1].content'"},
        {"truncation", set("truncation", {{"max_length", 5}}), "'truncation'"},
        {"top level", [](Json &j) { j = Json::array(); }, "not a JSON object"},
    };
    for (const auto &c : cases) {
        Json j = make_json(base);
        c.edit(j);
        const std::string msg = error_of([&] { Tokenizer::from_json(j.dump(), "bad.json"); });
        EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
        EXPECT_NE(msg.find("bad.json"), std::string::npos) << c.what << ": " << msg;
    }
}

TEST(Tokenizer, TruncatedAndMutatedFilesNeverCrash) {
    Spec base;
    base.pre_tokenizer = pre(kLlama3);
    base.merges = {{"a", "b"}, {"ab", "c"}};
    base.added = Json::array({added_token(300, "<|x|>", true)});
    const std::string good = make_json(base).dump();
    for (size_t n = 0; n < good.size(); n += 97)
        EXPECT_THROW(Tokenizer::from_json(good.substr(0, n)), Error) << n;
    std::mt19937 rng(5);
    int loaded = 0;
    for (int iter = 0; iter < 400; ++iter) {
        std::string b = good;
        for (int k = 0; k < 3; ++k) {
            const size_t pos = rng() % b.size();
            b[pos] = "{}[]\":, 0123456789abcnul\\-"[rng() % 27];
        }
        try {
            auto t = Tokenizer::from_json(b);
            ++loaded;
            const std::string text = "abc <|x|> 123 ab";
            (void)t->decode(t->encode(text));
        } catch (const Error &) {
        }
    }
    EXPECT_LT(loaded, 400);
}

TEST(Tokenizer, FromFolderReadsTheChatTemplateAndSpecialTokens) {
    test::TempDir d;
    Spec s;
    s.pre_tokenizer = pre(kQwen2);
    s.added =
        Json::array({added_token(300, "<|im_start|>", true), added_token(301, "<|im_end|>", true),
                     added_token(302, "<|endoftext|>", true)});
    test::spit(d / "tokenizer.json", make_json(s).dump());
    test::spit(d / "tokenizer_config.json",
               Json{{"eos_token", {{"content", "<|im_end|>"}}},
                    {"pad_token", "<|endoftext|>"},
                    {"bos_token", nullptr},
                    {"chat_template", "{% for m in messages %}{{'<|im_start|>' + m['role'] + '|' + "
                                      "m['content'] + eos_token}}{% endfor %}"}}
                   .dump());
    auto t = Tokenizer::from_folder(d.path());
    EXPECT_EQ(t->eos_token_id(), 301);
    EXPECT_EQ(t->pad_token_id(), 302);
    EXPECT_FALSE(t->bos_token_id().has_value());
    // The template is rendered as written (not recognized and replaced by a
    // built-in format), with the special tokens of tokenizer_config.json.
    EXPECT_FALSE(t->chat_template_source().empty());
    EXPECT_EQ(t->apply_chat_template({{"user", "hi"}}), "<|im_start|>user|hi<|im_end|>");
    // chat_template.jinja takes priority over tokenizer_config.json, as in transformers.
    test::spit(d / "chat_template.jinja", "{{ messages | length }}{{ eos_token }}\n");
    EXPECT_EQ(Tokenizer::from_folder(d.path())->apply_chat_template({{"user", "hi"}}),
              "1<|im_end|>");
    std::filesystem::remove(d / "chat_template.jinja");
    test::spit(d / "tokenizer_config.json", Json{{"eos_token", "<|nope|>"}}.dump());
    EXPECT_NE(error_of([&] { Tokenizer::from_folder(d.path()); }).find("'eos_token' = '<|nope|>'"),
              std::string::npos);
}

// `levels` Sequences, each the only part of the one around it, around
// `leaf`: JSON text (nlohmann's dump() would recurse as deep).
std::string nested_sequence(const std::string &list, int levels, const std::string &leaf) {
    std::string open, close;
    for (int i = 0; i < levels; ++i) {
        open += R"({"type": "Sequence", ")" + list + R"(": [)";
        close += "]}";
    }
    return open + leaf + close;
}

// The text of `j` with its top-level `key` set to the JSON text `value`.
std::string with_text(Json j, const std::string &key, const std::string &value) {
    j[key] = "@value@";
    std::string s = j.dump();
    s.replace(s.find("\"@value@\""), 9, value);
    return s;
}

// A Sequence nested 30,000 deep was read recursively (one stack frame and
// one ever longer key per level) until the process crashed.
TEST(Tokenizer, DeeplyNestedSequencesAreRefusedNamingThePath) {
    Spec base;
    base.pre_tokenizer = pre(nullptr);
    const Json j = make_json(base);
    const std::string nfc = R"({"type": "NFC"})", byte_level = R"({"type": "ByteLevel"})";
    struct Case {
        std::string key, list, leaf;
    };
    for (const Case &c : {Case{"normalizer", "normalizers", nfc},
                          Case{"pre_tokenizer", "pretokenizers", byte_level},
                          Case{"decoder", "decoders", byte_level},
                          Case{"post_processor", "processors", byte_level}}) {
        // 30,000 deep: refused by the JSON reader before anything is parsed.
        const std::string text = with_text(j, c.key, nested_sequence(c.list, 30000, c.leaf));
        std::string msg = error_of([&] { Tokenizer::from_json(text, "deep.json"); });
        EXPECT_NE(msg.find("deep.json: JSON nested deeper than 128 levels"), std::string::npos)
            << msg.substr(0, 200);
        // 40 sequences (80 levels): within JSON's limit, past the tokenizer's, named by path.
        msg = error_of([&] {
            Tokenizer::from_json(with_text(j, c.key, nested_sequence(c.list, 40, c.leaf)),
                                 "deep.json");
        });
        const std::string path = c.key + "." + c.list + "[0]." + c.list + "[0]";
        EXPECT_NE(msg.find("deep.json: '" + path), std::string::npos) << msg.substr(0, 200);
        EXPECT_NE(msg.find("' is nested deeper than 64 levels"), std::string::npos)
            << msg.substr(0, 200);
    }
    // Ten levels (20 deep) are read as one flat sequence.
    const std::string text =
        with_text(Json::parse(with_text(j, "normalizer", nested_sequence("normalizers", 10, nfc))),
                  "pre_tokenizer",
                  nested_sequence("pretokenizers", 10,
                                  R"({"type": "ByteLevel", "add_prefix_space": false})"));
    auto t = Tokenizer::from_json(text, "nested.json");
    EXPECT_EQ(t->decode(t->encode("e\xCC\x81 x")), "\xC3\xA9 x"); // NFC composes e + U+0301
}

// Values of the wrong JSON type, read with nlohmann's value(), escaped as its
// type_error (RL_ERR_INTERNAL at the C API) naming neither file nor key.
TEST(Tokenizer, ValuesOfTheWrongTypeAreErrorsNamingTheKeyAndTheType) {
    Spec base;
    base.pre_tokenizer = pre(kQwen2);
    base.merges = {{"a", "b"}};
    const std::vector<BadJson> cases = {
        {"vocab a number", [](Json &j) { j["model"]["vocab"] = 5; },
         "'model.vocab' must be an object, got number"},
        {"merge a number", [](Json &j) { j["model"]["merges"].push_back(5); },
         "'model.merges[1]' must be \"a b\" or [\"a\", \"b\"], got number"},
        {"added id a string",
         [](Json &j) {
             j["added_tokens"] = Json::array({Json{{"id", "x"}}});
         },
         "'added_tokens[0].id' must be a non-negative integer, got string"},
        {"model type a number", [](Json &j) { j["model"]["type"] = 5; },
         "'model.type' must be a string, got number"},
        {"byte fallback a string", [](Json &j) { j["model"]["byte_fallback"] = "no"; },
         "'model.byte_fallback' must be true or false, got string"},
        {"behavior a number",
         [](Json &j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = 3; },
         "'pre_tokenizer.pretokenizers[0].behavior' must be a string, got number"},
        {"normalizer type a list",
         [](Json &j) {
             j["normalizer"] = {{"type", Json::array()}};
         },
         "'normalizer.type' must be a string, got array"},
        {"vocab id past the limit", [](Json &j) { j["model"]["vocab"]["q"] = 5000000; },
         "'model.vocab['q']' = 5000000 must be an id in [0, 4194303]"},
        {"added id past the limit",
         [](Json &j) { j["added_tokens"] = Json::array({added_token(1 << 29, "<x>", true)}); },
         "'added_tokens[0].id' = 536870912 must be an id in [0, 4194303]"},
    };
    for (const auto &c : cases) {
        Json j = make_json(base);
        c.edit(j);
        const std::string msg = error_of([&] { Tokenizer::from_json(j.dump(), "tokenizer.json"); });
        EXPECT_NE(msg.find("tokenizer.json: " + c.expect), std::string::npos)
            << c.what << ": " << msg;
    }
}

// A chat_template list item whose name is not a string is no "default" (it
// was a type_error from nlohmann's value()).
TEST(Tokenizer, ChatTemplateItemsWithANonStringNameAreSkipped) {
    test::TempDir d;
    Spec s;
    s.pre_tokenizer = pre(kQwen2);
    test::spit(d / "tokenizer.json", make_json(s).dump());
    test::spit(d / "tokenizer_config.json",
               Json{{"chat_template", Json::array({Json{{"name", 5}, {"template", "no"}},
                                                   Json{{"name", "default"}, {"template", "ok"}}})}}
                   .dump());
    std::shared_ptr<Tokenizer> t;
    EXPECT_NO_THROW(t = Tokenizer::from_folder(d.path()));
    ASSERT_TRUE(t);
    EXPECT_EQ(t->chat_template_source(), "ok");
}

} // namespace
} // namespace rl::core
