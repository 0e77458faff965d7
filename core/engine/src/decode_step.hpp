// The decoding step of every generator in core/engine: Engine::generate
// (engine.cpp), Engine::generate_episodes (episodes.cpp) and the serving
// scheduler (scheduler.cpp) keep one Sequence per live sample and call these
// routines on the logits of each forward, so that a token is drawn, a
// sequence's end decided and a routing row recorded in one place. The loops
// differ only in what they run between steps: waves of samples (generate),
// observations appended between turns (episodes), requests admitted and
// retired between steps (the scheduler).
#pragma once

#include "text_tracker.hpp"

#include "rl/core/config.hpp"
#include "rl/core/engine.hpp"
#include "rl/core/sampling.hpp"

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rl::core::detail {

/// One sample while it is decoded.
struct Sequence {
    // Set by the loop when the sample starts.
    const SamplingParams *params = nullptr; ///< temperature, top-k, top-p, max_tokens
    const std::vector<int64_t> *stop_ids = nullptr;
    uint64_t seed = 0;
    int64_t prompt = 0, sample = 0; ///< sampling_uniform's (prompt, sample)
    int64_t prompt_len = 0;
    /// Ends the sample (Length) when prompt + tokens reach it; 0: no limit.
    int64_t context_limit = 0;
    int64_t top_logprobs = 0; ///< most likely tokens to report with each draw
    /// Ids per routing row (sparse layers * experts per token) when the
    /// routing is recorded (return_routed_experts); 0: not recorded.
    int64_t routed_width = 0;
    bool record_weights = false; ///< the routed experts' weights too (return_expert_logits)
    std::optional<TextTracker> text;

    // Kept by the step routines.
    std::vector<int64_t> tokens; ///< after the prompt (episodes: observations too)
    std::vector<float> logprobs;
    int64_t drawn = 0;     ///< tokens drawn so far: the position of the next draw
    size_t turn_start = 0; ///< max_tokens counts the tokens from here
    /// The routing of the prompt and of every token read so far,
    /// [rows, L_moe, K] flattened, and its weights in the same layout.
    std::vector<int64_t> routed;
    std::vector<float> routed_weights;
};

/// The sequences of samples [first_sample, end_sample) of an Engine call
/// (sample s: prompt s / params.n, sample s % params.n), each with its text
/// tracker, the routing recorded as params ask (return_routed_experts,
/// return_expert_logits).
std::vector<Sequence> start_samples(const std::vector<std::vector<int64_t>> &prompts,
                                    const SamplingParams &params,
                                    const std::vector<int64_t> &stop_ids, uint64_t seed,
                                    int64_t first_sample, int64_t end_sample, int64_t context_limit,
                                    const std::shared_ptr<const Tokenizer> &tokenizer,
                                    const ModelConfig &config);

/// The next token of one sequence.
struct Draw {
    int64_t token = 0;
    float logprob = 0; ///< under the sampling distribution
    /// The sequence's top_logprobs most likely tokens (token, logprob), most
    /// likely first, without the impossible ones.
    std::vector<std::pair<int64_t, float>> top;
};

/// Draws the next token of every sequence from its row of `logits`
/// [seqs, vocab]: rows sharing temperature / top-k / top-p are turned into
/// sampling logprobs together (sampling_logprobs) and drawn with the uniform
/// sampling_uniform(seed, prompt, sample, drawn) (draw_tokens). Nothing of a
/// sequence is changed: accept() takes the token.
std::vector<Draw> draw_next(const at::Tensor &logits, const std::vector<Sequence *> &seqs);

/// How a sequence (a turn, in an episode) ends, and its final text.
struct End {
    FinishReason reason = FinishReason::Length;
    std::string text;
};

/// Appends a drawn token to `seq` and decides whether it ends there: on one
/// of its stop ids (Stop; the text without the token), on a stop string
/// (Stop; the text cut before it), at max_tokens tokens since turn_start or
/// at the context limit (Length).
std::optional<End> accept(Sequence &seq, const Draw &draw);

/// draw_next, then accept for each sequence: the ends, in the order of seqs.
std::vector<std::optional<End>> step(const at::Tensor &logits, const std::vector<Sequence *> &seqs);

/// One forward's routing (R3), from the router logits a RouterLogitsRecorder
/// caught during it: the routed experts' ids of every token row the forward
/// read, and their weights when `weights`.
class ForwardRouting {
public:
    ForwardRouting(const std::vector<at::Tensor> &router_logits, const ModelConfig &config,
                   bool weights);
    int64_t rows() const { return rows_; }
    /// Appends rows [from, from + n) to seq's routing (and their weights when
    /// it records them); nothing when seq records no routing.
    void append(Sequence &seq, int64_t from, int64_t n) const;
    /// The rows in order: seqs[i] gets counts[i] of them (one each without
    /// counts), replacing what it had when restart[i] (it was prefilled
    /// again from its prompt). The counts must add up to rows().
    void append_in_order(const std::vector<Sequence *> &seqs,
                         const std::vector<int64_t> *counts = nullptr,
                         const std::vector<uint8_t> *restart = nullptr) const;

private:
    at::Tensor ids_, weights_; // [rows, L_moe, K] on the host; weights_ undefined unless asked
    int64_t rows_ = 0, width_ = 0;
};

/// The routing of a finished sequence: the tokens no forward read (its last
/// one; more when it ended before a forward ran) get rows of -1, "route
/// yourself", weights 0, up to prompt + tokens rows.
void pad_unread_routing(Sequence &seq);

/// Token ids as a CPU int64 tensor [n] (the model's decode / extend input).
at::Tensor long_tensor(const std::vector<int64_t> &ids);

} // namespace rl::core::detail
