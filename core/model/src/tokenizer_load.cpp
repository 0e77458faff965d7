// Loading and validating tokenizer.json: its parts' parsers, from_json/from_file/from_folder.
#include "rl/core/tokenizer.hpp"

#include "rl/core/atomic_file.hpp"
#include "rl/core/error.hpp"
#include "rl/core/json.hpp"
#include "rl/core/names.hpp"
#include "json_object.hpp"
#include "tokenizer_impl.hpp"
#include "unicode.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>

namespace rl::core {
namespace {

// GPT-2's byte-level pre-tokenizer pattern (used when ByteLevel.use_regex).
constexpr const char *kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

constexpr Named<Behavior> kBehaviors[] = {{Behavior::Removed, "Removed"},
                                          {Behavior::Isolated, "Isolated"},
                                          {Behavior::MergedWithPrevious, "MergedWithPrevious"},
                                          {Behavior::MergedWithNext, "MergedWithNext"},
                                          {Behavior::Contiguous, "Contiguous"}};

} // namespace

void Tokenizer::Impl::init_byte_table() {
    // GPT-2's reversible byte -> printable character map: printable
    // Latin-1 bytes map to themselves, the rest to U+0100 onwards.
    int next = 0;
    for (int b = 0; b < 256; ++b) {
        const bool keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        const uint32_t cp = keep ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++);
        byte_char[b] = unicode::encode(cp);
        char_byte[byte_char[b]] = static_cast<uint8_t>(b);
    }
}

void Tokenizer::Impl::parse_normalizer(const Json &n, const std::string &key) {
    if (n.is_null()) return;
    const std::string type = type_of(n, key);
    if (type == "Sequence") {
        if (!n.contains("normalizers") || !n["normalizers"].is_array())
            fail(key + ".normalizers", "must be a list" + got(member(n, "normalizers")));
        for (size_t i = 0; i < n["normalizers"].size(); ++i)
            parse_normalizer(n["normalizers"][i], key + ".normalizers[" + std::to_string(i) + "]");
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

std::string Tokenizer::Impl::type_of(const Json &p, const std::string &key) const {
    if (!p.is_object()) fail(key, "must be an object with a string 'type'" + got(p));
    if (!p.contains("type") || !p["type"].is_string())
        fail(key + ".type", "must be a string" + got(member(p, "type")));
    return p["type"].get<std::string>();
}

template <class F>
void Tokenizer::Impl::each_part(const Json &p, const char *list, const std::string &key, F parse) {
    const std::string at = key + "." + list;
    if (!p.contains(list) || !p[list].is_array()) fail(at, "must be a list" + got(member(p, list)));
    for (size_t i = 0; i < p[list].size(); ++i)
        parse(p[list][i], at + "[" + std::to_string(i) + "]");
}

void Tokenizer::Impl::parse_pretokenizer(const Json &p, const std::string &key) {
    const std::string type = type_of(p, key);
    auto flag = [&](const char *name, bool def) {
        if (!p.contains(name) || p[name].is_null()) return def;
        if (!p[name].is_boolean()) fail(key + "." + name, "must be true or false" + got(p[name]));
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
        if (!bj.is_null() && !bj.is_string()) fail(key + ".behavior", "must be a string" + got(bj));
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
        t.regex = std::make_unique<unicode::Regex>(t.individual_digits ? R"(\p{N})" : R"(\p{N}+)");
    } else {
        fail(key + ".type", "'" + type + "' is not supported (Sequence, Split, ByteLevel, Digits)");
    }
    pretokenizers.push_back(std::move(t));
}

void Tokenizer::Impl::parse_decoder(const Json &d, const std::string &key) {
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

void Tokenizer::Impl::parse_post_processor(const Json &p, const std::string &key) {
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
    if (!p.contains("single") || !p["single"].is_array()) fail(key + ".single", "must be a list");
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
                if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= size())
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

void Tokenizer::Impl::set_id(int32_t id, const std::string &token) {
    if (static_cast<size_t>(id) >= id_to_vocab.size()) {
        id_to_vocab.resize(static_cast<size_t>(id) + 1);
        in_vocab.resize(static_cast<size_t>(id) + 1, false);
    }
    id_to_vocab[id] = token;
    in_vocab[id] = true;
}

void Tokenizer::Impl::parse_model(const Json &m) {
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
        if (iab == vocab.end()) fail(key, "makes '" + a + b + "', which is not in the vocabulary");
        merges.emplace(pair_key(ia->second, ib->second),
                       std::make_pair(static_cast<int32_t>(i), iab->second));
    }
}

void Tokenizer::Impl::parse_added(const Json &list) {
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

void Tokenizer::Impl::index_added() {
    added_match.clear();
    for (auto &v : added_raw) v.clear();
    for (auto &v : added_norm) v.clear();
    for (size_t i = 0; i < added.size(); ++i) {
        const AddedToken &a = added[i];
        added_match.push_back(a.normalized ? normalize(a.content) : a.content);
        if (added_match.back().empty()) continue; // normalized away: never matches
        any_normalized = any_normalized || a.normalized;
        special_normalized = special_normalized || (a.normalized && a.special);
        (a.normalized ? added_norm : added_raw)[static_cast<uint8_t>(added_match[i][0])].push_back(
            i);
    }
    for (auto *table : {&added_raw, &added_norm})
        for (auto &v : *table)
            std::stable_sort(v.begin(), v.end(), [&](size_t x, size_t y) {
                return added_match[x].size() > added_match[y].size();
            });
}

// ---------------------------------------------------------------------------

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

} // namespace rl::core
