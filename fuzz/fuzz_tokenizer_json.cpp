// Fuzz target: tokenizer.json text (Tokenizer::from_json: the model, added
// tokens, normalizer, pre-tokenizer regexes, post-processor and decoder), then
// an encode and decode of a fixed text with special tokens, accents and
// emoji through whatever the input built.
#include "fuzz_target.hpp"

#include "rl/core/error.hpp"
#include "rl/core/tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::shared_ptr<rl::core::Tokenizer> tok;
    try {
        tok = rl::core::Tokenizer::from_json(fuzz_text(data, size), "fuzz tokenizer.json");
    } catch (const rl::core::Error &) {
        return 0;
    }
    try {
        static const std::string text = "<|im_start|>user\nHello, wörld! 123  spaces\t\u00e9\u0301 "
                                        "\xf0\x9f\x98\x80<|im_end|>\n";
        rl::core::EncodeOptions with_specials;
        with_specials.add_special_tokens = true;
        const std::vector<int32_t> ids = tok->encode(text, with_specials);
        (void)tok->decode(ids, false);
        (void)tok->decode(ids, true);
        const int64_t vocab = tok->vocab_size();
        for (int32_t id : ids) {
            if (id < 0 || id >= vocab) continue;
            (void)tok->id_to_token(id);
            (void)tok->token_bytes(id);
            (void)tok->is_special(id);
        }
        // A few ids around the ends of the vocabulary, as a decoder sees them.
        std::vector<int32_t> edge;
        for (int64_t id : {int64_t{0}, vocab / 2, vocab - 1})
            if (id >= 0 && id < vocab) edge.push_back(static_cast<int32_t>(id));
        (void)tok->decode(edge, false);
    } catch (const rl::core::Error &) {
    }
    return 0;
}
