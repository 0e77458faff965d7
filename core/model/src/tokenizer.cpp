#include "rl/core/tokenizer.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "rl/core/names.hpp"
#include "json_object.hpp"
#include "unicode.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <mutex>
#include <queue>
#include <unordered_map>

namespace rl::core {
namespace {

using Json = nlohmann::json;

// GPT-2's byte-level pre-tokenizer pattern (used when ByteLevel.use_regex).
constexpr const char *kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr size_t kCacheLimit = 1 << 16;

// Nesting depth of tokenizer.json (a value at `a.b[0]` is at depth 3). Real
// files nest 7 levels at most; the limit keeps the recursive readers (a
// Sequence inside a Sequence ...) off the end of the stack.
constexpr size_t kMaxJsonDepth = 64;
// The largest token id (vocabulary or added token): the id tables are dense
// vectors, so one id is memory for every id below it. The largest public
// vocabularies have ~262k ids.
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

// ", got <JSON type>" for messages about a value of the wrong type.
std::string got(const Json &v) {
    return std::string(", got ") + v.type_name();
}

// The member `key` of object `o`, or null: no copy, as nlohmann's value() makes.
const Json &member(const Json &o, const char *key) {
    static const Json null;
    if (!o.is_object()) return null;
    const auto it = o.find(key);
    return it == o.end() ? null : *it;
}

// The object of `text` from `source`, nested at most kMaxJsonDepth deep.
Json parse_bounded(const std::string &text, const std::string &source) {
    Json j = parse_json_object(text, source);
    const std::string deep = json_too_deep(j, "", kMaxJsonDepth);
    if (!deep.empty())
        throw Error(source + ": '" + deep + "' is nested deeper than " +
                    std::to_string(kMaxJsonDepth) + " levels (the limit)");
    return j;
}

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
constexpr Named<Behavior> kBehaviors[] = {{Behavior::Removed, "Removed"},
                                          {Behavior::Isolated, "Isolated"},
                                          {Behavior::MergedWithPrevious, "MergedWithPrevious"},
                                          {Behavior::MergedWithNext, "MergedWithNext"},
                                          {Behavior::Contiguous, "Contiguous"}};

struct PreTokenizer {
    enum class Kind { Split, ByteLevel, Digits } kind = Kind::Split;
    std::unique_ptr<unicode::Regex> regex;
    Behavior behavior = Behavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false;
    bool use_regex = true;
    bool individual_digits = false;
};

uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Splits `s` at the spans [b, e) in `matches` according to HF's
// SplitDelimiterBehavior. With invert, the non-matching text is the delimiter.
std::vector<std::string> split_pieces(const std::string &s,
                                      const std::vector<std::pair<size_t, size_t>> &matches,
                                      Behavior behavior, bool invert) {
    struct Span {
        size_t b, e;
        bool delim;
    };
    std::vector<Span> spans;
    size_t pos = 0;
    for (const auto &[b, e] : matches) {
        if (b > pos) spans.push_back({pos, b, invert});
        spans.push_back({b, e, !invert});
        pos = e;
    }
    if (pos < s.size()) spans.push_back({pos, s.size(), invert});

    std::vector<std::string> out;
    bool merge_next = false;
    for (size_t i = 0; i < spans.size(); ++i) {
        const Span &sp = spans[i];
        std::string text = s.substr(sp.b, sp.e - sp.b);
        switch (behavior) {
            case Behavior::Removed:
                if (!sp.delim) out.push_back(text);
                break;
            case Behavior::Isolated:
                out.push_back(text);
                break;
            case Behavior::MergedWithPrevious:
                if (sp.delim && !out.empty() && i > 0 && !spans[i - 1].delim)
                    out.back() += text;
                else
                    out.push_back(text);
                break;
            case Behavior::MergedWithNext:
                if (merge_next)
                    out.back() += text;
                else
                    out.push_back(text);
                merge_next = sp.delim;
                break;
            case Behavior::Contiguous:
                if (sp.delim && i > 0 && spans[i - 1].delim && !out.empty())
                    out.back() += text;
                else
                    out.push_back(text);
                break;
        }
    }
    return out;
}

bool is_word_byte(unsigned char c) {
    return std::isalnum(c) || c == '_' || c >= 0x80;
}

} // namespace

struct Tokenizer::Impl {
    std::string source;
    std::vector<unicode::Form> normalizers;
    std::vector<PreTokenizer> pretokenizers;

    std::unordered_map<std::string, int32_t> vocab;
    std::vector<std::string> id_to_vocab; // "" where the id is not in the vocab
    std::vector<bool> in_vocab;
    std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges; // -> (rank, merged id)
    bool ignore_merges = false;
    std::optional<int32_t> unk_id;

    std::vector<AddedToken> added;
    std::unordered_map<int32_t, size_t> added_by_id;
    std::unordered_map<std::string, size_t> added_by_content;
    // What each added token matches: its content, or for a `normalized`
    // token its content after the normalizers (matched in normalized text,
    // as Hugging Face does). Per table, candidates by first byte, longest
    // first: raw = the non-normalized tokens, norm = the normalized ones.
    std::vector<std::string> added_match;
    using FirstByteIndex = std::array<std::vector<size_t>, 256>;
    FirstByteIndex added_raw, added_norm;
    bool any_normalized = false, special_normalized = false;

    std::vector<int32_t> prefix, suffix;

    std::array<std::string, 256> byte_char;
    std::unordered_map<std::string, uint8_t> char_byte;

    mutable std::mutex cache_mu;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

    [[noreturn]] void fail(const std::string &key, const std::string &msg) const {
        throw Error(source + ": '" + key + "' " + msg);
    }

    void init_byte_table() {
        // GPT-2's reversible byte -> printable character map: printable
        // Latin-1 bytes map to themselves, the rest to U+0100 onwards.
        int next = 0;
        for (int b = 0; b < 256; ++b) {
            const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            const uint32_t cp =
                keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++);
            byte_char[b] = unicode::encode(cp);
            char_byte[byte_char[b]] = static_cast<uint8_t>(b);
        }
    }

    int64_t size() const { return static_cast<int64_t>(id_to_vocab.size()); }

    void parse_normalizer(const Json &n, const std::string &key) {
        if (n.is_null()) return;
        const std::string type = type_of(n, key);
        if (type == "Sequence") {
            if (!n.contains("normalizers") || !n["normalizers"].is_array())
                fail(key + ".normalizers", "must be a list" + got(member(n, "normalizers")));
            for (size_t i = 0; i < n["normalizers"].size(); ++i)
                parse_normalizer(n["normalizers"][i],
                                 key + ".normalizers[" + std::to_string(i) + "]");
        } else if (type == "NFC")
            normalizers.push_back(unicode::Form::NFC);
        else if (type == "NFD")
            normalizers.push_back(unicode::Form::NFD);
        else if (type == "NFKC")
            normalizers.push_back(unicode::Form::NFKC);
        else if (type == "NFKD")
            normalizers.push_back(unicode::Form::NFKD);
        else
            fail(key + ".type", "'" + type + "' is not supported (NFC, NFD, NFKC, NFKD, Sequence)");
    }

    // The "type" of the component object `p` at `key`.
    std::string type_of(const Json &p, const std::string &key) const {
        if (!p.is_object()) fail(key, "must be an object with a string 'type'" + got(p));
        if (!p.contains("type") || !p["type"].is_string())
            fail(key + ".type", "must be a string" + got(member(p, "type")));
        return p["type"].get<std::string>();
    }

    // parse(item, its key) for each item of the list p[list] (a Sequence's parts).
    template <class F>
    void each_part(const Json &p, const char *list, const std::string &key, F parse) {
        const std::string at = key + "." + list;
        if (!p.contains(list) || !p[list].is_array())
            fail(at, "must be a list" + got(member(p, list)));
        for (size_t i = 0; i < p[list].size(); ++i)
            parse(p[list][i], at + "[" + std::to_string(i) + "]");
    }

    void parse_pretokenizer(const Json &p, const std::string &key) {
        const std::string type = type_of(p, key);
        auto flag = [&](const char *name, bool def) {
            if (!p.contains(name) || p[name].is_null()) return def;
            if (!p[name].is_boolean())
                fail(key + "." + name, "must be true or false" + got(p[name]));
            return p[name].get<bool>();
        };
        PreTokenizer t;
        if (type == "Sequence") {
            each_part(p, "pretokenizers", key,
                      [&](const Json &x, const std::string &k) { parse_pretokenizer(x, k); });
            return;
        } else if (type == "Split") {
            t.kind = PreTokenizer::Kind::Split;
            if (!p.contains("pattern") || !p["pattern"].is_object())
                fail(key + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
            const Json &pat = p["pattern"];
            std::string regex;
            if (pat.contains("Regex") && pat["Regex"].is_string())
                regex = pat["Regex"].get<std::string>();
            else if (pat.contains("String") && pat["String"].is_string())
                regex = unicode::regex_escape(pat["String"].get<std::string>());
            else
                fail(key + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
            try {
                t.regex = std::make_unique<unicode::Regex>(regex);
            } catch (const Error &e) {
                fail(key + ".pattern", e.what());
            }
            const Json &bj = member(p, "behavior");
            if (!bj.is_null() && !bj.is_string())
                fail(key + ".behavior", "must be a string" + got(bj));
            const std::string b = bj.is_null() ? "Isolated" : bj.get<std::string>();
            const auto behavior = value_in(kBehaviors, b);
            if (!behavior) fail(key + ".behavior", "'" + b + "' is not a split behavior");
            t.behavior = *behavior;
            t.invert = flag("invert", false);
        } else if (type == "ByteLevel") {
            t.kind = PreTokenizer::Kind::ByteLevel;
            t.add_prefix_space = flag("add_prefix_space", true);
            t.use_regex = flag("use_regex", true);
            if (t.use_regex) t.regex = std::make_unique<unicode::Regex>(kGpt2Pattern);
        } else if (type == "Digits") {
            t.kind = PreTokenizer::Kind::Digits;
            t.individual_digits = flag("individual_digits", false);
            t.regex =
                std::make_unique<unicode::Regex>(t.individual_digits ? R"(\p{N})" : R"(\p{N}+)");
        } else {
            fail(key + ".type",
                 "'" + type + "' is not supported (Sequence, Split, ByteLevel, Digits)");
        }
        pretokenizers.push_back(std::move(t));
    }

    void parse_decoder(const Json &d, const std::string &key) {
        if (d.is_null()) return;
        const std::string type = type_of(d, key);
        if (type == "ByteLevel") return;
        if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
            for (size_t i = 0; i < d["decoders"].size(); ++i)
                parse_decoder(d["decoders"][i], key + ".decoders[" + std::to_string(i) + "]");
            return;
        }
        fail(key + ".type", "'" + type + "' is not supported (ByteLevel)");
    }

    void parse_post_processor(const Json &p, const std::string &key) {
        if (p.is_null()) return;
        const std::string type = type_of(p, key);
        if (type == "ByteLevel") return;
        if (type == "Sequence") {
            each_part(p, "processors", key,
                      [&](const Json &x, const std::string &k) { parse_post_processor(x, k); });
            return;
        }
        if (type != "TemplateProcessing")
            fail(key + ".type",
                 "'" + type + "' is not supported (ByteLevel, TemplateProcessing, Sequence)");
        if (!p.contains("single") || !p["single"].is_array())
            fail(key + ".single", "must be a list");
        const Json &specials = member(p, "special_tokens");
        bool seen_sequence = false;
        prefix.clear();
        suffix.clear();
        for (size_t i = 0; i < p["single"].size(); ++i) {
            const Json &item = p["single"][i];
            const std::string ikey = key + ".single[" + std::to_string(i) + "]";
            if (item.contains("Sequence")) {
                if (seen_sequence) fail(ikey, "repeats the sequence");
                seen_sequence = true;
            } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id") &&
                       item["SpecialToken"]["id"].is_string()) {
                const std::string name = item["SpecialToken"]["id"].get<std::string>();
                if (!specials.contains(name) || !specials[name].contains("ids") ||
                    !specials[name]["ids"].is_array())
                    fail(key + ".special_tokens", "has no ids for '" + name + "'");
                for (const auto &id : specials[name]["ids"]) {
                    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
                        id.get<int64_t>() >= size())
                        fail(key + ".special_tokens['" + name + "'].ids",
                             "holds an id outside the vocabulary");
                    (seen_sequence ? suffix : prefix)
                        .push_back(static_cast<int32_t>(id.get<int64_t>()));
                }
            } else {
                fail(ikey, "must be {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
            }
        }
        if (!seen_sequence) fail(key + ".single", "has no {\"Sequence\": ...} item");
    }

    void set_id(int32_t id, const std::string &token) {
        if (static_cast<size_t>(id) >= id_to_vocab.size()) {
            id_to_vocab.resize(static_cast<size_t>(id) + 1);
            in_vocab.resize(static_cast<size_t>(id) + 1, false);
        }
        id_to_vocab[id] = token;
        in_vocab[id] = true;
    }

    void parse_model(const Json &m) {
        if (!m.is_object()) fail("model", "must be an object" + got(m));
        const Json &type_json = member(m, "type");
        if (!type_json.is_null() && !type_json.is_string())
            fail("model.type", "must be a string" + got(type_json));
        const std::string type = type_json.is_null() ? "BPE" : type_json.get<std::string>();
        if (type != "BPE") fail("model.type", "'" + type + "' is not supported (BPE)");
        if (m.contains("dropout") && !m["dropout"].is_null() &&
            !(m["dropout"].is_number() && m["dropout"].get<double>() == 0.0))
            fail("model.dropout", "must be null: BPE dropout is not supported");
        for (const char *k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
            if (m.contains(k) && !m[k].is_null() &&
                !(m[k].is_string() && m[k].get<std::string>().empty()))
                fail(std::string("model.") + k, "is not supported by byte-level BPE");
        }
        const Json &byte_fallback = member(m, "byte_fallback");
        if (!byte_fallback.is_null() && !byte_fallback.is_boolean())
            fail("model.byte_fallback", "must be true or false" + got(byte_fallback));
        if (byte_fallback.is_boolean() && byte_fallback.get<bool>())
            fail("model.byte_fallback", "is true: SentencePiece byte fallback is not supported");
        ignore_merges = m.contains("ignore_merges") && m["ignore_merges"].is_boolean() &&
                        m["ignore_merges"].get<bool>();
        if (!m.contains("vocab") || !m["vocab"].is_object())
            fail("model.vocab", "must be an object" + got(member(m, "vocab")));
        for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
            if (!it.value().is_number_integer())
                fail("model.vocab['" + it.key() + "']",
                     "must be a non-negative integer id" + got(it.value()));
            if (it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > kMaxTokenId)
                fail("model.vocab['" + it.key() + "']", "= " + it.value().dump() +
                                                            " must be an id in [0, " +
                                                            std::to_string(kMaxTokenId) + "]");
            const auto id = static_cast<int32_t>(it.value().get<int64_t>());
            if (static_cast<size_t>(id) < in_vocab.size() && in_vocab[id])
                fail("model.vocab['" + it.key() + "']",
                     "reuses id " + std::to_string(id) + " of '" + id_to_vocab[id] + "'");
            vocab[it.key()] = id;
            set_id(id, it.key());
        }
        if (m.contains("unk_token") && m["unk_token"].is_string()) {
            auto it = vocab.find(m["unk_token"].get<std::string>());
            if (it == vocab.end()) fail("model.unk_token", "is not in the vocabulary");
            unk_id = it->second;
        }
        if (!m.contains("merges") || m["merges"].is_null()) return;
        if (!m["merges"].is_array()) fail("model.merges", "must be a list" + got(m["merges"]));
        const Json &ms = m["merges"];
        for (size_t i = 0; i < ms.size(); ++i) {
            const std::string key = "model.merges[" + std::to_string(i) + "]";
            std::string a, b;
            if (ms[i].is_string()) {
                const std::string s = ms[i].get<std::string>();
                const size_t sp = s.find(' ');
                if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() ||
                    s.find(' ', sp + 1) != std::string::npos)
                    fail(key, "= '" + s + "' must be two tokens separated by one space");
                a = s.substr(0, sp);
                b = s.substr(sp + 1);
            } else if (ms[i].is_array() && ms[i].size() == 2 && ms[i][0].is_string() &&
                       ms[i][1].is_string()) {
                a = ms[i][0].get<std::string>();
                b = ms[i][1].get<std::string>();
            } else {
                fail(key, "must be \"a b\" or [\"a\", \"b\"]" + got(ms[i]));
            }
            auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
            if (ia == vocab.end()) fail(key, "uses '" + a + "', which is not in the vocabulary");
            if (ib == vocab.end()) fail(key, "uses '" + b + "', which is not in the vocabulary");
            if (iab == vocab.end())
                fail(key, "makes '" + a + b + "', which is not in the vocabulary");
            merges.emplace(pair_key(ia->second, ib->second),
                           std::make_pair(static_cast<int32_t>(i), iab->second));
        }
    }

    void parse_added(const Json &list) {
        if (list.is_null()) return;
        if (!list.is_array()) fail("added_tokens", "must be a list" + got(list));
        for (size_t i = 0; i < list.size(); ++i) {
            const Json &t = list[i];
            const std::string key = "added_tokens[" + std::to_string(i) + "]";
            if (!t.is_object()) fail(key, "must be an object" + got(t));
            if (!t.contains("id") || !t["id"].is_number_integer())
                fail(key + ".id", "must be a non-negative integer" + got(member(t, "id")));
            if (t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() > kMaxTokenId)
                fail(key + ".id", "= " + t["id"].dump() + " must be an id in [0, " +
                                      std::to_string(kMaxTokenId) + "]");
            if (!t.contains("content") || !t["content"].is_string())
                fail(key + ".content", "must be a non-empty string" + got(member(t, "content")));
            if (t["content"].get<std::string>().empty())
                fail(key + ".content", "must be a non-empty string");
            AddedToken a;
            a.id = static_cast<int32_t>(t["id"].get<int64_t>());
            a.content = t["content"].get<std::string>();
            if (!unicode::valid_utf8(a.content)) fail(key + ".content", "is not valid UTF-8");
            auto flag = [&](const char *name) {
                if (!t.contains(name) || t[name].is_null()) return false;
                if (!t[name].is_boolean())
                    fail(key + "." + name, "must be true or false" + got(t[name]));
                return t[name].get<bool>();
            };
            a.special = flag("special");
            a.lstrip = flag("lstrip");
            a.rstrip = flag("rstrip");
            a.single_word = flag("single_word");
            a.normalized = flag("normalized");
            if (added_by_id.count(a.id)) fail(key + ".id", "repeats id " + std::to_string(a.id));
            if (added_by_content.count(a.content))
                fail(key + ".content", "repeats '" + a.content + "'");
            if (static_cast<size_t>(a.id) >= id_to_vocab.size()) {
                id_to_vocab.resize(static_cast<size_t>(a.id) + 1);
                in_vocab.resize(static_cast<size_t>(a.id) + 1, false);
            }
            added_by_id[a.id] = added.size();
            added_by_content[a.content] = added.size();
            added.push_back(a);
        }
    }

    std::string normalize(std::string text) const {
        for (auto f : normalizers) text = unicode::normalize(text, f);
        return text;
    }

    // After the normalizers are known: what each added token matches.
    void index_added() {
        added_match.clear();
        for (auto &v : added_raw) v.clear();
        for (auto &v : added_norm) v.clear();
        for (size_t i = 0; i < added.size(); ++i) {
            const AddedToken &a = added[i];
            added_match.push_back(a.normalized ? normalize(a.content) : a.content);
            if (added_match.back().empty()) continue; // normalized away: never matches
            any_normalized = any_normalized || a.normalized;
            special_normalized = special_normalized || (a.normalized && a.special);
            (a.normalized ? added_norm : added_raw)[static_cast<uint8_t>(added_match[i][0])]
                .push_back(i);
        }
        for (auto *table : {&added_raw, &added_norm})
            for (auto &v : *table)
                std::stable_sort(v.begin(), v.end(), [&](size_t x, size_t y) {
                    return added_match[x].size() > added_match[y].size();
                });
    }

    // -- encoding -----------------------------------------------------------

    struct Segment {
        size_t begin, end; // text span, when added < 0
        int64_t added = -1;
    };

    // Splits the text around the added tokens of `table` (leftmost, then
    // longest match). Special tokens are skipped when !parse_special or when
    // they overlap a plain span.
    std::vector<Segment> split_added(std::string_view text, bool parse_special,
                                     const std::vector<std::pair<size_t, size_t>> &plain,
                                     const FirstByteIndex &table) const {
        std::vector<Segment> out;
        size_t seg_start = 0, i = 0;
        while (i < text.size()) {
            const auto &cands = table[static_cast<uint8_t>(text[i])];
            int64_t hit = -1;
            for (size_t c : cands) {
                const AddedToken &a = added[c];
                const std::string &pat = added_match[c];
                if (a.special && !parse_special) continue;
                if (text.compare(i, pat.size(), pat) != 0) continue;
                if (a.special) {
                    bool in_plain = false;
                    for (const auto &s : plain)
                        in_plain = in_plain || (i < s.second && i + pat.size() > s.first);
                    if (in_plain) continue;
                }
                if (a.single_word) {
                    const bool left_ok =
                        i == 0 || !is_word_byte(static_cast<unsigned char>(text[i - 1]));
                    const size_t e = i + pat.size();
                    const bool right_ok =
                        e >= text.size() || !is_word_byte(static_cast<unsigned char>(text[e]));
                    if (!left_ok || !right_ok) continue;
                }
                hit = static_cast<int64_t>(c);
                break;
            }
            if (hit < 0) {
                ++i;
                continue;
            }
            const AddedToken &a = added[static_cast<size_t>(hit)];
            size_t b = i, e = i + added_match[static_cast<size_t>(hit)].size();
            // White space as Hugging Face strips it (char::is_whitespace).
            if (a.lstrip) {
                while (b > seg_start) {
                    size_t s = b - 1;
                    while (s > seg_start && (static_cast<uint8_t>(text[s]) & 0xC0) == 0x80) --s;
                    if (!unicode::is_white_space(unicode::code_point_at(text, s))) break;
                    b = s;
                }
            }
            if (a.rstrip) {
                while (e < text.size()) {
                    if (!unicode::is_white_space(unicode::code_point_at(text, e))) break;
                    e += unicode::char_len(text, e);
                }
            }
            if (b > seg_start) out.push_back({seg_start, b, -1});
            out.push_back({b, e, hit});
            seg_start = i = e;
        }
        if (seg_start < text.size()) out.push_back({seg_start, text.size(), -1});
        return out;
    }

    // Pre-tokenizes normalized text.
    std::vector<std::string> pre_tokenize(std::string text) const {
        std::vector<std::string> pieces{std::move(text)};
        for (const auto &p : pretokenizers) {
            std::vector<std::string> next;
            for (auto &piece : pieces) {
                if (piece.empty()) continue;
                switch (p.kind) {
                    case PreTokenizer::Kind::Split:
                    case PreTokenizer::Kind::Digits: {
                        auto parts = split_pieces(
                            piece, p.regex->find_all(piece),
                            p.kind == PreTokenizer::Kind::Digits ? Behavior::Isolated : p.behavior,
                            p.kind == PreTokenizer::Kind::Split && p.invert);
                        for (auto &s : parts)
                            if (!s.empty()) next.push_back(std::move(s));
                        break;
                    }
                    case PreTokenizer::Kind::ByteLevel: {
                        if (p.add_prefix_space && piece[0] != ' ') piece.insert(piece.begin(), ' ');
                        std::vector<std::string> parts;
                        if (p.use_regex)
                            parts = split_pieces(piece, p.regex->find_all(piece),
                                                 Behavior::Isolated, false);
                        else
                            parts.push_back(piece);
                        for (const auto &s : parts) {
                            if (s.empty()) continue;
                            std::string mapped;
                            for (unsigned char c : s) mapped += byte_char[c];
                            next.push_back(std::move(mapped));
                        }
                        break;
                    }
                }
            }
            pieces = std::move(next);
        }
        return pieces;
    }

    int32_t symbol_id(const std::string &sym) const {
        auto it = vocab.find(sym);
        if (it != vocab.end()) return it->second;
        if (unk_id) return *unk_id;
        throw Error(source + ": cannot encode '" + sym +
                    "': not in the vocabulary and the model has no unk_token");
    }

    void bpe(const std::string &word, std::vector<int32_t> *out) const {
        {
            std::lock_guard<std::mutex> lock(cache_mu);
            auto it = cache.find(word);
            if (it != cache.end()) {
                out->insert(out->end(), it->second.begin(), it->second.end());
                return;
            }
        }
        std::vector<int32_t> ids;
        auto direct = ignore_merges ? vocab.find(word) : vocab.end();
        if (direct != vocab.end()) {
            ids.push_back(direct->second);
        } else {
            struct Sym {
                int32_t id;
                int32_t prev, next;
                bool alive;
            };
            std::vector<Sym> syms;
            for (size_t i = 0; i < word.size();) {
                const size_t n = unicode::char_len(word, i);
                syms.push_back({symbol_id(word.substr(i, n)), static_cast<int32_t>(syms.size()) - 1,
                                static_cast<int32_t>(syms.size()) + 1, true});
                i += n;
            }
            if (!syms.empty()) syms.back().next = -1;
            using Cand = std::pair<int32_t, int32_t>; // (rank, left index)
            std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
            auto push = [&](int32_t left) {
                if (left < 0) return;
                const int32_t right = syms[left].next;
                if (right < 0) return;
                auto m = merges.find(pair_key(syms[left].id, syms[right].id));
                if (m != merges.end()) heap.push({m->second.first, left});
            };
            for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
            while (!heap.empty()) {
                const auto [rank, left] = heap.top();
                heap.pop();
                if (!syms[left].alive) continue;
                const int32_t right = syms[left].next;
                if (right < 0) continue;
                auto m = merges.find(pair_key(syms[left].id, syms[right].id));
                if (m == merges.end() || m->second.first != rank) continue; // stale entry
                syms[left].id = m->second.second;
                syms[right].alive = false;
                syms[left].next = syms[right].next;
                if (syms[right].next >= 0) syms[syms[right].next].prev = left;
                push(syms[left].prev);
                push(left);
            }
            for (const auto &s : syms)
                if (s.alive) ids.push_back(s.id);
        }
        out->insert(out->end(), ids.begin(), ids.end());
        std::lock_guard<std::mutex> lock(cache_mu);
        if (cache.size() >= kCacheLimit) cache.clear();
        cache.emplace(word, std::move(ids));
    }

    // -- decoding -----------------------------------------------------------

    std::string bytes_of(int32_t id) const {
        auto a = added_by_id.find(id);
        if (a != added_by_id.end()) return added[a->second].content;
        if (id < 0 || static_cast<size_t>(id) >= in_vocab.size() || !in_vocab[id])
            throw Error(source + ": token id " + std::to_string(id) +
                        " is not in the vocabulary (size " + std::to_string(size()) + ")");
        const std::string &tok = id_to_vocab[id];
        std::string out;
        for (size_t i = 0; i < tok.size();) {
            const size_t n = unicode::char_len(tok, i);
            auto it = char_byte.find(tok.substr(i, n));
            if (it == char_byte.end()) return tok; // not byte-level: its own UTF-8
            out += static_cast<char>(it->second);
            i += n;
        }
        return out;
    }

    bool special(int32_t id) const {
        auto a = added_by_id.find(id);
        return a != added_by_id.end() && added[a->second].special;
    }
};

// ---------------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<Tokenizer> Tokenizer::from_json(const std::string &json_text,
                                                const std::string &source) {
    const Json j = parse_bounded(json_text, source);
    std::shared_ptr<Tokenizer> t(new Tokenizer());
    Impl &m = *t->impl_;
    m.source = source;
    if (j.contains("truncation") && !j["truncation"].is_null())
        m.fail("truncation", "is set: truncation inside tokenizer.json is not supported");
    m.init_byte_table();
    if (!j.contains("model")) m.fail("model", "is required");
    m.parse_model(j["model"]);
    m.parse_added(member(j, "added_tokens"));
    m.parse_normalizer(member(j, "normalizer"), "normalizer");
    m.index_added();
    m.parse_pretokenizer(j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()
                             ? j["pre_tokenizer"]
                             : Json{{"type", "Sequence"}, {"pretokenizers", Json::array()}},
                         "pre_tokenizer");
    const bool byte_level =
        std::any_of(m.pretokenizers.begin(), m.pretokenizers.end(),
                    [](const PreTokenizer &p) { return p.kind == PreTokenizer::Kind::ByteLevel; });
    if (!byte_level)
        m.fail("pre_tokenizer",
               "has no ByteLevel step: only byte-level BPE tokenizers are supported");
    m.parse_decoder(member(j, "decoder"), "decoder");
    m.parse_post_processor(member(j, "post_processor"), "post_processor");
    return t;
}

std::shared_ptr<Tokenizer> Tokenizer::from_file(const std::string &path) {
    return from_json(read_file(path), path);
}

std::shared_ptr<Tokenizer> Tokenizer::from_folder(const std::string &dir) {
    namespace fs = std::filesystem;
    auto t = from_file((fs::path(dir) / "tokenizer.json").string());
    const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
    std::string chat_template;
    if (fs::exists(cfg_path)) {
        const std::string where = cfg_path.string();
        const Json cfg = parse_json_object(read_file(where), where);
        auto token = [&](const char *key) -> std::optional<int32_t> {
            if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
            std::string content;
            if (cfg[key].is_string())
                content = cfg[key].get<std::string>();
            else if (cfg[key].is_object() && cfg[key].contains("content") &&
                     cfg[key]["content"].is_string())
                content = cfg[key]["content"].get<std::string>();
            else
                throw Error(where + ": '" + key + "' must be a token string");
            auto id = t->token_to_id(content);
            if (!id)
                throw Error(where + ": '" + key + "' = '" + content +
                            "' is not a token of tokenizer.json");
            return id;
        };
        // Special tokens as transformers passes them to chat templates.
        Json specials = Json::object();
        for (const char *key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                                "cls_token", "mask_token"}) {
            if (!cfg.contains(key) || cfg[key].is_null()) continue;
            if (cfg[key].is_string())
                specials[key] = cfg[key];
            else if (cfg[key].is_object() && cfg[key].contains("content") &&
                     cfg[key]["content"].is_string())
                specials[key] = cfg[key]["content"];
        }
        if (cfg.contains("additional_special_tokens") &&
            cfg["additional_special_tokens"].is_array()) {
            Json extra = Json::array();
            for (const auto &e : cfg["additional_special_tokens"]) {
                if (e.is_string())
                    extra.push_back(e);
                else if (e.is_object() && e.contains("content") && e["content"].is_string())
                    extra.push_back(e["content"]);
            }
            specials["additional_special_tokens"] = std::move(extra);
        }
        t->special_tokens_json_ = specials.dump();
        t->eos_id_ = token("eos_token");
        t->bos_id_ = token("bos_token");
        t->pad_id_ = token("pad_token");
        if (cfg.contains("chat_template")) {
            const Json &ct = cfg["chat_template"];
            if (ct.is_string())
                chat_template = ct.get<std::string>();
            else if (ct.is_array()) {
                for (const auto &e : ct)
                    if (member(e, "name") == "default" && e.contains("template") &&
                        e["template"].is_string())
                        chat_template = e["template"].get<std::string>();
            }
        }
    }
    std::string where = cfg_path.string() + " chat_template";
    // As in transformers, a chat_template.jinja file takes priority over the
    // template in tokenizer_config.json.
    const fs::path jinja = fs::path(dir) / "chat_template.jinja";
    if (fs::exists(jinja)) {
        chat_template = read_file(jinja.string());
        where = jinja.string();
    }
    if (!chat_template.empty()) {
        t->chat_template_source_ = chat_template;
        t->chat_template_where_ = where;
        // A template the engine cannot parse does not stop the model from
        // loading; rendering with it gives the parse error.
        try {
            t->chat_template_ = std::make_shared<const ChatTemplate>(chat_template, where);
        } catch (const Error &e) {
            t->chat_template_error_ = e.what();
        }
    }
    return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions &options) const {
    const Impl &m = *impl_;
    size_t bad = 0;
    if (!unicode::valid_utf8(text, &bad))
        throw Error("encode: text is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    std::vector<int32_t> ids;
    if (options.add_special_tokens) ids = m.prefix;
    // As Hugging Face: the non-normalized added tokens are found in the raw
    // text; the rest is normalized, the normalized added tokens are found in
    // it, and what remains is pre-tokenized and merged.
    auto encode_normalized = [&](const std::string &norm, bool parse_special) {
        if (!m.any_normalized) {
            for (const auto &piece : m.pre_tokenize(norm)) m.bpe(piece, &ids);
            return;
        }
        for (const auto &seg : m.split_added(norm, parse_special, {}, m.added_norm)) {
            if (seg.added >= 0) {
                ids.push_back(m.added[static_cast<size_t>(seg.added)].id);
                continue;
            }
            for (const auto &piece : m.pre_tokenize(norm.substr(seg.begin, seg.end - seg.begin)))
                m.bpe(piece, &ids);
        }
    };
    for (const auto &seg :
         m.split_added(text, options.parse_special, options.plain_spans, m.added_raw)) {
        if (seg.added >= 0) {
            ids.push_back(m.added[static_cast<size_t>(seg.added)].id);
            continue;
        }
        // Plain spans are byte ranges of the raw text: where special
        // normalized tokens exist, the segment is cut at their borders and
        // each part normalized alone (no special token inside a plain span).
        std::vector<std::pair<size_t, size_t>> cuts;
        if (m.special_normalized && options.parse_special)
            for (const auto &p : options.plain_spans)
                if (p.first < seg.end && p.second > seg.begin)
                    cuts.emplace_back(std::max(p.first, seg.begin), std::min(p.second, seg.end));
        if (cuts.empty()) {
            encode_normalized(m.normalize(std::string(text.substr(seg.begin, seg.end - seg.begin))),
                              options.parse_special);
            continue;
        }
        std::sort(cuts.begin(), cuts.end());
        size_t pos = seg.begin;
        for (const auto &[b, e] : cuts) {
            if (e <= pos) continue;
            const size_t from = std::max(b, pos);
            if (from > pos)
                encode_normalized(m.normalize(std::string(text.substr(pos, from - pos))), true);
            encode_normalized(m.normalize(std::string(text.substr(from, e - from))), false);
            pos = e;
        }
        if (pos < seg.end)
            encode_normalized(m.normalize(std::string(text.substr(pos, seg.end - pos))), true);
    }
    if (options.add_special_tokens) ids.insert(ids.end(), m.suffix.begin(), m.suffix.end());
    return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t> &ids, bool skip_special_tokens) const {
    std::string bytes;
    for (int32_t id : ids) {
        if (skip_special_tokens && impl_->special(id)) continue;
        bytes += impl_->bytes_of(id);
    }
    return unicode::lossy(bytes);
}

int64_t Tokenizer::vocab_size() const {
    return impl_->size();
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
    auto a = impl_->added_by_content.find(std::string(token));
    if (a != impl_->added_by_content.end()) return impl_->added[a->second].id;
    auto v = impl_->vocab.find(std::string(token));
    if (v != impl_->vocab.end()) return v->second;
    return std::nullopt;
}

std::string Tokenizer::id_to_token(int32_t id) const {
    auto a = impl_->added_by_id.find(id);
    if (a != impl_->added_by_id.end()) return impl_->added[a->second].content;
    if (id < 0 || id >= impl_->size() || !impl_->in_vocab[id])
        throw Error(impl_->source + ": token id " + std::to_string(id) +
                    " is not in the vocabulary");
    return impl_->id_to_vocab[id];
}

bool Tokenizer::is_special(int32_t id) const {
    return impl_->special(id);
}

const std::vector<AddedToken> &Tokenizer::added_tokens() const {
    return impl_->added;
}

std::string Tokenizer::token_bytes(int32_t id) const {
    return impl_->bytes_of(id);
}

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage> &messages,
                                           const ChatTemplateOptions &options) const {
    return apply_chat_template_json(chat_messages_json(messages), options);
}

std::string Tokenizer::apply_chat_template_json(const std::string &messages_json,
                                                const ChatTemplateOptions &options) const {
    if (!chat_template_error_.empty()) throw Error(chat_template_error_);
    if (!chat_template_)
        throw Error(impl_->source +
                    ": the model has no chat template (no 'chat_template' in "
                    "tokenizer_config.json, no chat_template.jinja); name a built-in format "
                    "(chatml, llama3) instead");
    return chat_template_->render(messages_json, options, special_tokens_json_);
}

// ---------------------------------------------------------------------------

StreamDecoder::StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
    : tok_(std::move(tokenizer)), skip_special_(skip_special_tokens) {
    check(tok_ != nullptr, "StreamDecoder: no tokenizer");
}

std::string StreamDecoder::push(int32_t id) {
    if (skip_special_ && tok_->is_special(id)) return {};
    pending_ += tok_->token_bytes(id);
    const size_t n = unicode::emit_prefix_len(pending_);
    std::string out = unicode::lossy(std::string_view(pending_).substr(0, n));
    pending_.erase(0, n);
    return out;
}

std::string StreamDecoder::finish() {
    std::string out = unicode::lossy(pending_);
    pending_.clear();
    return out;
}

} // namespace rl::core
