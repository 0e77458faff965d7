// Hugging Face tokenizer.json, byte-level BPE (GPT-2, Llama-3, Qwen2/3 and the
// tiny preset): normalizer (NFC/NFKC/NFD/NFKD), pre-tokenizers (Split with the
// GPT-2 / Llama-3 / Qwen regexes, ByteLevel, Digits), BPE merges, added and
// special tokens, the ByteLevel decoder and the template post-processor.
// Anything else is refused with an error naming the JSON key.
#pragma once

#include "rl/core/chat_template.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rl::core {

struct AddedToken {
    int32_t id = 0;
    std::string content;
    bool special = false;
    bool lstrip = false;      ///< swallow white space on the left
    bool rstrip = false;      ///< swallow white space on the right
    bool single_word = false; ///< match only as a whole word
    bool normalized = false;
};

struct EncodeOptions {
    /// Apply the post-processor template (e.g. Llama-3's <|begin_of_text|>).
    bool add_special_tokens = false;
    /// Recognize special added tokens written in the text ("<|im_end|>"). When
    /// false they are encoded as plain text.
    bool parse_special = true;
    /// Byte ranges [begin, end) of the text where special tokens are never
    /// recognized (user content inside a rendered chat template): a special
    /// token overlapping one is plain text. Elsewhere the text is split as
    /// without them, so the ids equal the plain encode's when the spans hold
    /// no special-token text.
    std::vector<std::pair<size_t, size_t>> plain_spans;
};

class Tokenizer {
public:
    /// Parses tokenizer.json text; `source` names it in errors.
    static std::shared_ptr<Tokenizer> from_json(const std::string &json_text,
                                                const std::string &source = "tokenizer.json");
    static std::shared_ptr<Tokenizer> from_file(const std::string &path);
    /// tokenizer.json plus, when present, tokenizer_config.json (chat template,
    /// eos / bos / pad tokens).
    static std::shared_ptr<Tokenizer> from_folder(const std::string &dir);
    ~Tokenizer();

    std::vector<int32_t> encode(std::string_view text, const EncodeOptions &options = {}) const;
    /// UTF-8 text of the ids; invalid byte sequences become U+FFFD. Throws
    /// Error for an id outside the vocabulary.
    std::string decode(const std::vector<int32_t> &ids, bool skip_special_tokens = false) const;

    /// Number of ids (largest id + 1).
    int64_t vocab_size() const;
    std::optional<int32_t> token_to_id(std::string_view token) const;
    /// The vocabulary string of an id (byte-level form); throws when unknown.
    std::string id_to_token(int32_t id) const;
    bool is_special(int32_t id) const;
    const std::vector<AddedToken> &added_tokens() const;
    /// The raw bytes an id stands for (added tokens: their content).
    std::string token_bytes(int32_t id) const;

    /// From tokenizer_config.json when loaded from a folder.
    std::optional<int32_t> eos_token_id() const { return eos_id_; }
    std::optional<int32_t> bos_token_id() const { return bos_id_; }
    std::optional<int32_t> pad_token_id() const { return pad_id_; }
    /// The model's Jinja chat template (chat_template.jinja, else
    /// tokenizer_config.json "chat_template"); empty when it has none.
    const std::string &chat_template_source() const { return chat_template_source_; }
    /// The tokenizer's special tokens as template variables (bos_token,
    /// eos_token, pad_token, unk_token, ...: those tokenizer_config.json sets),
    /// a JSON object.
    const std::string &special_tokens_json() const { return special_tokens_json_; }

    /// Renders a conversation with the model's own chat template. Throws Error
    /// when the model has none, when the template uses a construct the engine
    /// does not support (naming it and its line) or when rendering fails.
    std::string apply_chat_template(const std::vector<ChatMessage> &messages,
                                    const ChatTemplateOptions &options = {}) const;
    /// Same with messages as a JSON array of message objects (tool_calls,
    /// reasoning_content, ... pass through to the template).
    std::string apply_chat_template_json(const std::string &messages_json,
                                         const ChatTemplateOptions &options = {}) const;

    struct Impl;

private:
    Tokenizer();
    std::unique_ptr<Impl> impl_;
    std::optional<int32_t> eos_id_, bos_id_, pad_id_;
    std::string chat_template_source_;
    std::string chat_template_where_;
    std::shared_ptr<const ChatTemplate> chat_template_;
    std::string chat_template_error_; ///< why the template did not parse
    std::string special_tokens_json_ = "{}";
};

/// Incremental decoding for generation: push ids one at a time and get the
/// text that became complete (UTF-8 sequences split across tokens are held
/// back until their last byte arrives). The concatenation of all push() and
/// finish() results equals decode() of all ids.
class StreamDecoder {
public:
    explicit StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer,
                           bool skip_special_tokens = false);
    std::string push(int32_t id);
    /// The held-back bytes (ill-formed ones as U+FFFD); resets the decoder.
    std::string finish();

private:
    std::shared_ptr<const Tokenizer> tok_;
    bool skip_special_;
    std::string pending_;
};

} // namespace rl::core
