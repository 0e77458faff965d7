// host/serve/api.hpp: what every route of the server shares: refusals that
// name the field and strict reading of JSON request bodies (fields.hpp), the
// exception boundary of a handler, and running a request's samples on the
// scheduler (SampleGroup).
#pragma once

#include "fields.hpp"
#include "http.hpp"
#include "server.hpp"

#include "rl/core/scheduler.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rl::serve {

using nlohmann::json;

/// A handler wrapped in the error boundary: ApiError -> its status;
/// rl::core::SchedulerFull -> 503 with Retry-After: 1; rl::core::Error -> 400
/// (NotFound: 404; BadState: 409); anything else -> 500 with its message.
/// After the handler has responded an exception only ends the connection.
Handler guarded(std::function<void(const Request &, Responder &)> fn);

void send_json(Responder &r, const json &j, int status = 200);

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

/// The LoRA adapter a request selects by name (SGLang's `lora_path`: the
/// `lora_name` of a /load_lora_adapter; `param` names the field). Null or
/// absent: "" (the base model). Refuses a non-string or an adapter that is
/// not loaded, naming `param` and the adapters that are.
std::string adapter_named(const Server &server, const json *value, const std::string &param);

} // namespace rl::serve
