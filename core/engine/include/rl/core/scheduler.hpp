// rl/core/scheduler.hpp: continuous batching for serving. Requests arrive
// one at a time from any thread (an HTTP server's connections); one scheduler
// thread owns the model and a KV cache of fixed slots. Between two decode
// steps it admits queued requests into free slots (prefill), so requests that
// arrived at different times share every decode step; a finished, cancelled
// or timed-out request frees its slot at once.
//
// Sampling is the engine's, one decoding step for both
// (core/engine/src/decode_step.hpp; rules in sampling.hpp): the same
// temperature / top-k / top-p rules, the same stops, the same reported
// logprobs (of the sampling distribution; at temperature 1 without top-k /
// top-p they equal the trainer's), and the same
// counter-based randomness: token `position` of a request uses
// sampling_uniform(seed, 0, sample_index, position). A request therefore
// produces the tokens Engine::generate({prompt}, params with n = sample_index
// + 1) gives its sample `sample_index`, whatever else runs beside it.
//
// LoRA: a request whose params name an adapter (SamplingParams::adapter, one
// in the policy's registry) samples with it; each step runs one forward per
// adapter among the running requests (the base model's being one), so
// requests of different adapters still share steps. Versions stay those of
// the policy's weights (an adapter does not change while a request holds it).
//
// Weights: exclusive(fn) waits for the step in progress, runs fn with no step
// running (the server swaps weights there), then adopts the policy's version.
// Requests in flight at that moment are re-prefilled from their prompt and the
// tokens generated so far under the new weights (never a KV cache computed by
// old weights next to new ones); their result reports the first and the last
// weight version they were sampled under.
#pragma once

#include "rl/core/engine.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/sampling.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {

struct SchedulerConfig {
    /// Requests decoded together (KV-cache slots). The KV budget may lower it.
    int64_t max_running = 32;
    /// Requests waiting for a slot; submit() beyond it throws SchedulerFull.
    int64_t max_queued = 256;
    /// Longest prompt + completion of one request, in tokens; 0: the model's
    /// max_position_embeddings, capped at 4096.
    int64_t max_context = 0;
    /// KV-cache budget as a fraction of the device's memory (as EngineConfig).
    double kv_cache_fraction = 0.3;
    /// QeRL exploration noise, as the engine's (EngineConfig::noise,
    /// total_steps, first_step, seed): every policy version the scheduler
    /// adopts samples with qerl_noisy_norms of sigma noise.sigma(max(0,
    /// version - first_step), total_steps).
    NoiseSchedule noise;
    int64_t total_steps = 0;
    int64_t first_step = 0;
    std::optional<uint64_t> seed;
};

/// Thrown by submit() when the queue is full (a server answers 503 with
/// Retry-After).
class SchedulerFull : public Error {
public:
    explicit SchedulerFull(const std::string &what) : Error(ErrorKind::BadState, what) {}
};

enum class RequestEnd { Stop, Length, Cancelled, Timeout, Error };
const char *request_end_name(RequestEnd e); ///< "stop", "length", "cancelled", "timeout", "error"

/// One sampled token, as the scheduler reports it while a request runs.
struct TokenEvent {
    int64_t token = 0;
    float logprob = 0; ///< under the sampling distribution
    /// The `top_logprobs` most likely tokens of the sampling distribution
    /// (token, logprob), most likely first; empty when not asked for.
    std::vector<std::pair<int64_t, float>> top;
    /// Text this token settles (UTF-8 whole characters; may be empty while a
    /// character or a possible stop string is still open). The texts of all
    /// of a request's events, concatenated, equal its RequestResult::text
    /// (the last event carries what was held back). Only with a tokenizer.
    std::string text;
};

/// The end of a request.
struct RequestResult {
    RequestEnd end = RequestEnd::Length;
    std::vector<int64_t> tokens;
    std::vector<float> logprobs;
    std::string text;  ///< completion text, stop string excluded
    std::string error; ///< RequestEnd::Error: what went wrong
    int64_t prompt_tokens = 0;
    int64_t first_version = 0; ///< weight version of the first sampled token
    int64_t last_version = 0;  ///< weight version of the last one
    /// With SamplingParams::return_routed_experts: the mixture-of-experts
    /// routing of prompt + tokens, [rows, routed_layers, routed_k] flattened,
    /// as Engine::generate records it (Generation::routed_experts): the prompt
    /// rows from its prefill, each token's row from the step that read it,
    /// -1 rows for tokens never read (the last one). After a re-prefill
    /// (weights changed, memory resumed) the rows are that forward's.
    std::vector<int32_t> routed_experts;
    int64_t routed_layers = 0, routed_k = 0;
    /// With SamplingParams::return_expert_logits as well: the weights of
    /// those experts, float32 in the layout of routed_experts (0 in -1 rows).
    std::vector<float> routed_expert_weights;
};

struct ServeRequest {
    std::vector<int64_t> prompt;
    /// n must be 1 (a server submits one request per sample, with
    /// sample_index 0..n-1 and one seed). stop / stop_token_ids as the engine.
    SamplingParams params;
    int64_t sample_index = 0;
    int64_t top_logprobs = 0; ///< 0..20
    /// Not finished by then: ends with RequestEnd::Timeout. max(): none.
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
    /// Called on the scheduler thread for every token, in order; must be quick
    /// and must not call back into the scheduler except cancel().
    std::function<void(const TokenEvent &)> on_token;
    /// Called exactly once on the scheduler thread when the request ends
    /// (also on cancel, timeout, error and scheduler shutdown).
    std::function<void(RequestResult)> on_done;
};

class Scheduler {
public:
    Scheduler(std::shared_ptr<Policy> policy, SchedulerConfig config = {});
    /// Ends every queued and running request (RequestEnd::Cancelled) and joins
    /// the thread.
    ~Scheduler();
    Scheduler(const Scheduler &) = delete;
    Scheduler &operator=(const Scheduler &) = delete;

    /// Thread-safe. Validates (empty prompt, ids outside the vocabulary, prompt
    /// + max_tokens beyond max_context, bad params: Error naming the field; an
    /// adapter the policy does not have: NotFound naming the ones it has),
    /// queues, and returns the request's id. SchedulerFull when the queue is full.
    uint64_t submit(ServeRequest request);
    /// Thread-safe; a request already finished or unknown is ignored. The
    /// request ends with RequestEnd::Cancelled before its next token.
    void cancel(uint64_t id);

    /// Stops decoding after the step in progress (queued and running requests
    /// wait, their state kept) / starts again. Thread-safe.
    void pause();
    void resume();
    bool paused() const;

    /// Runs fn on the calling thread while no step runs, then adopts the
    /// policy's version (see the file comment). Thread-safe; an exception from
    /// fn propagates and the scheduler keeps the version it had.
    void exclusive(const std::function<void()> &fn);

    /// Frees the KV cache (running requests are re-prefilled when memory is
    /// resumed; nothing decodes meanwhile) / allocates it again.
    void release_memory();
    void resume_memory();

    struct Stats {
        int64_t running = 0, queued = 0, slots = 0;
        int64_t version = 0;
        double noise_sigma = 0;       ///< QeRL noise of the version (0: clean)
        int64_t tokens_generated = 0; ///< since start
        int64_t cache_bytes = 0;
        bool paused = false, memory_released = false;
    };
    Stats stats() const;
    int64_t max_context() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

} // namespace rl::core
