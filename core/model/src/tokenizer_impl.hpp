// Tokenizer::Impl (a loaded tokenizer.json) and the types its source files share.
#pragma once

#include "rl/core/error.hpp"
#include "rl/core/tokenizer.hpp"

#include "unicode.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rl::core {

using Json = nlohmann::json;

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokenizer {
    enum class Kind { Split, ByteLevel, Digits } kind = Kind::Split;
    std::unique_ptr<unicode::Regex> regex;
    Behavior behavior = Behavior::Isolated;
    bool invert = false;
    bool add_prefix_space = false;
    bool use_regex = true;
    bool individual_digits = false;
};

inline uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

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

    void init_byte_table();

    int64_t size() const { return static_cast<int64_t>(id_to_vocab.size()); }

    void parse_normalizer(const Json &n, const std::string &key);

    // The "type" of the component object `p` at `key`.
    std::string type_of(const Json &p, const std::string &key) const;

    // parse(item, its key) for each item of the list p[list] (a Sequence's parts).
    template <class F>
    void each_part(const Json &p, const char *list, const std::string &key, F parse);

    void parse_pretokenizer(const Json &p, const std::string &key);

    void parse_decoder(const Json &d, const std::string &key);

    void parse_post_processor(const Json &p, const std::string &key);

    void set_id(int32_t id, const std::string &token);

    void parse_model(const Json &m);

    void parse_added(const Json &list);

    std::string normalize(std::string text) const;

    // After the normalizers are known: what each added token matches.
    void index_added();

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
                                     const FirstByteIndex &table) const;

    // Pre-tokenizes normalized text.
    std::vector<std::string> pre_tokenize(std::string text) const;

    int32_t symbol_id(const std::string &sym) const;

    void bpe(const std::string &word, std::vector<int32_t> *out) const;

    // -- decoding -----------------------------------------------------------

    std::string bytes_of(int32_t id) const;

    bool special(int32_t id) const;
};

} // namespace rl::core
