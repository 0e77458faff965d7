// Text of one sample while it is generated: incremental decoding and
// stop-string detection, kept by each sequence of the decoding step
// (decode_step.hpp).
#pragma once

#include "rl/core/tokenizer.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rl::core::detail {

class TextTracker {
public:
    /// No tokenizer: no text, no stop strings (the caller refuses those).
    TextTracker(const std::shared_ptr<const Tokenizer> &tok, const std::vector<std::string> &stop)
        : stop_(stop) {
        if (tok) decoder_.emplace(tok);
        for (const auto &s : stop_) longest_ = std::max(longest_, s.size());
    }

    /// Appends a token's text; true when a stop string is now complete (the
    /// text is then cut before it).
    bool push(int64_t id) {
        if (!decoder_) return false;
        const size_t before = text_.size();
        text_ += decoder_->push(static_cast<int32_t>(id));
        if (stop_.empty() || text_.size() == before) return false;
        const size_t from = before >= longest_ ? before - longest_ + 1 : 0;
        size_t hit = std::string::npos;
        for (const auto &s : stop_) {
            const size_t at = text_.find(s, from);
            if (at != std::string::npos) hit = std::min(hit, at);
        }
        if (hit == std::string::npos) return false;
        text_.resize(hit);
        return true;
    }

    /// Text that can be shown now and was not returned before: everything but
    /// the bytes that could still begin a stop string, on a UTF-8 boundary.
    std::string take_settled() {
        size_t safe = text_.size();
        if (longest_ > 1) safe = safe >= longest_ - 1 ? safe - (longest_ - 1) : 0;
        while (safe > emitted_ && safe < text_.size() &&
               (static_cast<unsigned char>(text_[safe]) & 0xC0) == 0x80)
            --safe;
        if (safe <= emitted_) return {};
        std::string out = text_.substr(emitted_, safe - emitted_);
        emitted_ = safe;
        return out;
    }
    size_t emitted() const { return emitted_; }

    /// The whole text, with the decoder's held-back bytes (end of sample).
    std::string finish() {
        if (decoder_) text_ += decoder_->finish();
        return std::move(text_);
    }
    /// The whole text as cut by a stop string.
    std::string cut() { return std::move(text_); }

private:
    std::optional<StreamDecoder> decoder_;
    std::vector<std::string> stop_;
    size_t longest_ = 0;
    size_t emitted_ = 0;
    std::string text_;
};

} // namespace rl::core::detail
