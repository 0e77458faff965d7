// Encoding (added tokens, pre-tokenizers, BPE), decoding, the Tokenizer API, StreamDecoder.
#include "rl/core/tokenizer.hpp"

#include "rl/core/error.hpp"
#include "tokenizer_impl.hpp"
#include "unicode.hpp"

#include <algorithm>
#include <mutex>
#include <queue>

namespace rl::core {
namespace {

constexpr size_t kCacheLimit = 1 << 16;

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

std::string Tokenizer::Impl::normalize(std::string text) const {
    for (auto f : normalizers) text = unicode::normalize(text, f);
    return text;
}

std::vector<Tokenizer::Impl::Segment>
Tokenizer::Impl::split_added(std::string_view text, bool parse_special,
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

std::vector<std::string> Tokenizer::Impl::pre_tokenize(std::string text) const {
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
                        parts = split_pieces(piece, p.regex->find_all(piece), Behavior::Isolated,
                                             false);
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

int32_t Tokenizer::Impl::symbol_id(const std::string &sym) const {
    auto it = vocab.find(sym);
    if (it != vocab.end()) return it->second;
    if (unk_id) return *unk_id;
    throw Error(source + ": cannot encode '" + sym +
                "': not in the vocabulary and the model has no unk_token");
}

void Tokenizer::Impl::bpe(const std::string &word, std::vector<int32_t> *out) const {
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

std::string Tokenizer::Impl::bytes_of(int32_t id) const {
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

bool Tokenizer::Impl::special(int32_t id) const {
    auto a = added_by_id.find(id);
    return a != added_by_id.end() && added[a->second].special;
}

// ---------------------------------------------------------------------------

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

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