// Fuzz target: the strict request reading that the OpenAI and SGLang routes
// share (serve/fields.hpp): a request body through json_body, then every
// field of it through each Fields reader (integer ranges, numbers, booleans,
// strings, string lists, integer lists, neutral values, unknown-field
// checks), one level of nested values read as objects too (stream_options,
// sampling_params; a non-object is refused), and the body again as server
// options (read_options).
// The route functions themselves (read_common, read_prompt, the chat
// messages, the SGLang sampling_params) take the Server (vocabulary, model
// name, tokenizer) and are not reachable without the engine.
#include "fuzz_target.hpp"
#include "serve_request.hpp"

#include "serve/fields.hpp"

#include "rl/core/error.hpp"

#include <limits>

namespace {

using rl::serve::ApiError;
using rl::serve::Fields;
using rl::serve::json;

// Every reader on one key; each refusal is an ApiError naming the field.
void read_key(const Fields &f, const char *key) {
    constexpr int64_t lo = std::numeric_limits<int64_t>::min();
    constexpr int64_t hi = std::numeric_limits<int64_t>::max();
    const std::vector<std::function<void()>> readers = {
        [&] { f.integer(key, lo, hi); },
        [&] { f.integer(key, -1, 128); },
        [&] { f.number(key, 0, 1e4); },
        [&] { f.number(key, -std::numeric_limits<double>::max(), 1); },
        [&] { f.boolean(key); },
        [&] { f.string(key); },
        [&] { f.strings(key, 16); },
        [&] { f.integers(key, 0, 151935); },
        [&] { f.integers(key, lo, hi); },
        [&] { f.neutral(key, 0); },
        [&] { f.neutral(key, 1); },
        [&] { f.must_be_false(key, "fuzz"); },
        [&] {
            f.only({"model", "prompt", "messages", "n"});
        },
    };
    for (const auto &read : readers) {
        try {
            read();
        } catch (const ApiError &) {
        }
    }
}

// A value read as an object (the body, stream_options, sampling_params, ...):
// one that is not an object is refused by Fields itself, naming it.
void read_object(const json &object, const std::string &prefix, int depth) {
    const Fields f(object, prefix);
    for (const auto &item : object.items()) {
        read_key(f, item.key().c_str());
        if (depth == 0) {
            try {
                read_object(item.value(), prefix + item.key() + ".", depth + 1);
            } catch (const ApiError &) {
            }
        }
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const rl::serve::Request req = post_request("/v1/completions", data, size);
    try {
        const json body = rl::serve::json_body(req, /*allow_empty=*/true);
        read_object(body, "", 0);
        (void)rl::serve::dump(body);
    } catch (const ApiError &) {
    }
    struct Options {
        std::string host, api_key, model_path;
        int port = 0, max_connections = 0;
        size_t max_body_bytes = 0;
        double idle_timeout_s = 0;
    } options;
    try {
        rl::serve::read_options(req.body, "fuzz options", [&](const Fields &f) {
            f.only(rl::serve::http_options_and({}));
            rl::serve::read_http_options(f, options);
        });
    } catch (const rl::core::Error &) {
    }
    return 0;
}
