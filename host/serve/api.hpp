// host/serve/api.hpp: what every route of the server shares: refusals that
// name the field, strict reading of JSON request bodies (unknown fields and
// wrong types are 400s), the exception boundary of a handler, and running a
// request's samples on the scheduler (SampleGroup).
#pragma once

#include "http.hpp"
#include "server.hpp"

#include "rl/core/scheduler.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace rl::serve {

using nlohmann::json;

/// A refused request: the HTTP status, a message naming the bad thing and
/// the field (`param`, OpenAI's error.param).
class ApiError : public std::runtime_error {
public:
    ApiError(int status, const std::string &message, std::string param = "", Headers headers = {})
        : std::runtime_error(message), status(status), param(std::move(param)),
          headers(std::move(headers)) {}
    int status;
    std::string param;
    Headers headers;
};

/// Throws ApiError 400 naming `param`.
[[noreturn]] void refuse(const std::string &param, const std::string &message);

/// A handler wrapped in the error boundary: ApiError -> its status;
/// rl::core::SchedulerFull -> 503 with Retry-After: 1; rl::core::Error -> 400
/// (NotFound: 404; BadState: 409); anything else -> 500 with its message.
/// After the handler has responded an exception only ends the connection.
Handler guarded(std::function<void(const Request &, Responder &)> fn);

/// The request body as a JSON object; an empty body is {} when allow_empty.
/// ApiError 400 for bad JSON (with the parser's position) or a non-object.
json json_body(const Request &req, bool allow_empty = false);
/// JSON text; invalid UTF-8 is replaced, never an exception.
std::string dump(const json &j);
void send_json(Responder &r, const json &j, int status = 200);

/// Reads the fields of one JSON object strictly. Errors name the field as
/// `prefix + key` ("sampling_params.top_k"). Null counts as absent.
class Fields {
public:
    explicit Fields(const json &object, std::string prefix = "");
    /// Refuses the first key not in `known` ("unknown field 'x'").
    void only(const std::vector<std::string_view> &known) const;
    const json *get(const char *key) const; ///< null when absent or null
    bool has(const char *key) const { return get(key) != nullptr; }
    std::string name(const char *key) const { return prefix_ + key; }

    std::optional<int64_t> integer(const char *key, int64_t min, int64_t max) const;
    std::optional<double> number(const char *key, double min, double max) const;
    std::optional<bool> boolean(const char *key) const;
    std::optional<std::string> string(const char *key) const;
    /// A string or a list of strings (OpenAI's `stop`), at most `max_items`.
    std::optional<std::vector<std::string>> strings(const char *key, size_t max_items) const;
    /// A list of integers in [min, max].
    std::optional<std::vector<int64_t>> integers(const char *key, int64_t min, int64_t max) const;
    /// A field accepted only at its neutral value (frequency_penalty: 0):
    /// any other number is refused as not supported.
    void neutral(const char *key, double value) const;
    /// A field accepted only as false / absent (echo: true is refused).
    void must_be_false(const char *key, const std::string &why) const;

private:
    json o_; // a copy: callers pass temporaries
    std::string prefix_;
};

// ---- running samples -------------------------------------------------------------------

/// One scheduler request: one sample of one prompt.
struct SampleSpec {
    std::vector<int64_t> prompt;
    core::SamplingParams params; ///< n = 1; seed set
    int64_t sample_index = 0;
    int64_t top_logprobs = 0;
    std::string rid; ///< registered under this id; empty: the group's
};

struct SampleOutput {
    core::RequestResult result;
    std::vector<core::TokenEvent> events; ///< every sampled token, in order

    /// A streamed token added to a partial output: its event, id and logprob.
    void add_token(const core::TokenEvent &e) {
        events.push_back(e);
        result.tokens.push_back(e.token);
        result.logprobs.push_back(e.logprob);
    }
};

/// Reads a server's options: `text` is a JSON object (empty or null: none),
/// handed to read() as Fields; errors are core::Error starting "<what>: ".
void read_options(const std::string &text, const std::string &what,
                  const std::function<void(const Fields &)> &read);

/// The options of the HTTP side every server has, followed by `own`.
std::vector<std::string_view> http_options_and(std::initializer_list<std::string_view> own);

/// Reads the HTTP-side options (host, port, api_key, model_path,
/// max_body_bytes, max_connections, idle_timeout_s) into a server config.
template <class Config>
void read_http_options(const Fields &f, Config &c) {
    if (auto v = f.string("host")) c.host = *v;
    if (auto v = f.integer("port", 0, 65535)) c.port = static_cast<int>(*v);
    if (auto v = f.string("api_key")) c.api_key = *v;
    if (auto v = f.string("model_path")) c.model_path = *v;
    if (auto v = f.integer("max_body_bytes", 1024, int64_t{1} << 40))
        c.max_body_bytes = static_cast<size_t>(*v);
    if (auto v = f.integer("max_connections", 1, 1 << 20)) c.max_connections = static_cast<int>(*v);
    if (auto v = f.number("idle_timeout_s", 0.001, 1e9)) c.idle_timeout_s = *v;
}

/// The HttpServer settings of a server config: its host, port and limits,
/// with idle_timeout_s for the read and write timeouts too.
template <class Config>
HttpConfig http_config_of(const Config &c) {
    HttpConfig h;
    h.host = c.host;
    h.port = c.port;
    h.max_connections = c.max_connections;
    h.max_body_bytes = c.max_body_bytes;
    h.read_timeout_s = h.idle_timeout_s = h.write_timeout_s = c.idle_timeout_s;
    return h;
}

/// The samples of one HTTP request on the scheduler: submitted together,
/// registered with the server under a request id (abort_request,
/// pause_generation), cancelled together when the client goes away, and
/// cancelled when the group is destroyed before they end.
class SampleGroup {
public:
    SampleGroup(Server &server, std::string rid);
    ~SampleGroup();
    SampleGroup(const SampleGroup &) = delete;
    SampleGroup &operator=(const SampleGroup &) = delete;

    /// Submits every sample (deadline: the server's request_timeout_s). A full
    /// queue cancels the ones already submitted and throws ApiError 503 with
    /// Retry-After; a request the scheduler refuses is ApiError 400.
    void submit(std::vector<SampleSpec> specs);
    /// Blocks until every sample has ended. When the client goes away first,
    /// cancels them all, waits for their ends and returns false.
    bool wait(Responder &r);
    /// Hands tokens and ends to the callbacks on this thread, in the order the
    /// scheduler produced them, until every sample has ended. Returns false
    /// (everything cancelled) when the client went away or a callback
    /// returned false.
    bool stream(Responder &r, const std::function<bool(size_t, const core::TokenEvent &)> &on_token,
                const std::function<bool(size_t, const SampleOutput &)> &on_end);
    const std::vector<SampleOutput> &outputs() const;
    size_t size() const;
    const std::string &rid() const { return rid_; }

private:
    struct State;
    void cancel_all();
    bool wait_ended(double seconds);
    Server &server_;
    std::string rid_;
    std::shared_ptr<State> state_;
    std::vector<uint64_t> ids_;
    std::vector<uint64_t> tickets_;
};

// ---- shared pieces of the generation routes ----------------------------------------------

/// The model's vocabulary size (the embedding's rows).
int64_t vocab_size(const Server &server);
/// Refuses ids outside the vocabulary, naming `param` and the position.
void check_token_ids(const Server &server, const std::vector<int64_t> &ids,
                     const std::string &param);
/// Text -> ids (special-token text is recognized, as the prompt's author
/// wrote it). Refuses a model without a tokenizer naming `param`.
std::vector<int64_t> encode_text(const Server &server, const std::string &text,
                                 const std::string &param);
/// Refuses max_tokens above the server's limit or beyond the context.
void check_lengths(Server &server, size_t prompt_tokens, int64_t max_tokens,
                   const std::string &prompt_param, const std::string &max_tokens_param);
/// The text of one token (decode of the single id); "" without a tokenizer.
std::string token_text(const Server &server, int64_t id);
/// The stop string or stop token id that ended a sample, or null.
json matched_stop(const Server &server, const SampleSpec &spec, const core::RequestResult &r);
/// The stop ids: the model's EOS ids (unless ignore_eos) plus `extra`.
std::vector<int64_t> stop_ids(const Server &server, bool ignore_eos,
                              const std::vector<int64_t> &extra);

} // namespace rl::serve
