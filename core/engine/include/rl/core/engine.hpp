// rl/core/engine.hpp: the co-located rollout engine. Batched generation over
// the model core's KV cache, reading the policy's parameters in place (the
// same CausalLM object the trainer optimizes: weight sync is adopting the new
// policy version and dropping cached state, no copy). Sampling rules are in
// sampling.hpp.
//
// One generate call: every prompt is prefilled once into a cache slot and the
// slot copied to its n samples; then one decode step per token runs all
// unfinished samples together (the decoding step of generate_episodes and of
// the serving scheduler too: core/engine/src/decode_step.hpp). With
// max_batch_sequences > 0 the samples are run in waves of at most that many
// slots. Generation runs under
// c10::InferenceMode (no autograd state is recorded).
#pragma once

#include "rl/core/kv_cache.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/sampling.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rl::core {

namespace detail {
struct Sequence; // one sample while it is decoded (core/engine/src/decode_step.hpp)
} // namespace detail

/// QeRL exploration noise (Surogate's noise_scheduler; docs/moe.md): the
/// engine samples with Gaussian noise N(0, sigma^2) added to the RMSNorm
/// weights of every decoder layer (input_layernorm, post_attention_layernorm)
/// and the final norm, sigma decaying geometrically over the run's stages, the
/// first stage noise-free. The trainer's weights are never changed.
struct NoiseSchedule {
    bool enabled = false;
    double sigma_start = 5e-2; ///< sigma of the first noisy stage
    double sigma_end = 5e-4;   ///< sigma of the last stage
    int64_t num_stages = 10;   ///< stages over the run, the first noise-free (>= 2)

    /// Sigma at optimizer step `step` (the policy version) of a run of
    /// `total_steps` steps; 0 when disabled or total_steps <= 0. With
    /// N = num_stages the run is cut into N stages of total_steps / N steps
    /// (stage = floor(min(step, total_steps) / (total_steps / N))); stage 0 has
    /// sigma 0, stage s >= 1 has sigma_start * (sigma_end / sigma_start)^((s -
    /// 1) / (N - 2)) (sigma_start alone when N = 2), the last stage's sigma
    /// also at step total_steps.
    double sigma(int64_t step, int64_t total_steps) const;
};

/// QeRL noise of one policy version: noisy copies of `model`'s RMSNorm
/// weights (every decoder layer's input_layernorm and
/// post_attention_layernorm, and the final norm) with N(0, sigma^2) noise
/// drawn in float32 on the CPU from a generator seeded by mix64(seed ^
/// mix64(version)), added to the clean weight in float32 and rounded to its
/// dtype; empty when sigma <= 0. The engine's and the serving scheduler's.
NormWeights qerl_noisy_norms(CausalLM &model, double sigma, uint64_t seed, int64_t version);

struct EngineConfig {
    int64_t max_batch_sequences = 0; ///< samples decoded together; 0: all of a call
    /// KV-cache budget: this fraction of the device's memory (GPU memory on
    /// CUDA, physical RAM on the CPU). Calls whose samples do not fit run in
    /// waves that do; one sample that does not fit is an error.
    double kv_cache_fraction = 0.3;
    /// The LoRA adapter generate uses when a call names none (its name in
    /// the policy's registry); empty: the base model.
    std::string adapter;
    NoiseSchedule noise;
    /// Optimizer steps of the run (the noise schedule's length; scripts pass
    /// run.steps).
    int64_t total_steps = 0;
    /// The policy version that is step 0 of the noise schedule (optimizer
    /// steps before the RL loop, e.g. a supervised warm-up; scripts pass
    /// sft.steps): the schedule's step is max(0, version - first_step).
    int64_t first_step = 0;
    /// Seeds the noise (scripts pass run.seed); unset: 0.
    std::optional<uint64_t> seed;
    /// JSON object (empty text or null: defaults); unknown keys are errors.
    static EngineConfig from_json(const std::string &json_text);
};

enum class FinishReason { Stop, Length };
const char *finish_reason_name(FinishReason r); ///< "stop", "length"

struct Generation {
    std::vector<int64_t> token_ids;    ///< completions back to back
    std::vector<float> logprobs;       ///< per completion token (sampling distribution)
    std::vector<int64_t> cu_seqlens;   ///< [samples + 1]
    std::vector<int64_t> prompt_index; ///< [samples]
    std::vector<std::string> completions;
    std::vector<FinishReason> finish_reasons;
    int64_t policy_version = 0;
    /// With SamplingParams::return_routed_experts: the mixture-of-experts
    /// routing of every input token, int64 [rows, L_moe, K] flattened, the
    /// rows of each sample back to back: its prompt tokens (the prefill's
    /// routing), then its completion tokens (the routing of the decoding step
    /// that read the token; the last token is never read: a row of -1, "route
    /// yourself"). Sample s has prompt length + completion length rows, the
    /// layout of the trainer's `routed_experts` for that sequence. Else empty.
    std::vector<int64_t> routed_experts;
    int64_t routed_layers = 0, routed_k = 0; ///< L_moe and K of routed_experts
    /// With SamplingParams::return_expert_logits as well: the weights each
    /// row's experts were mixed with, float32, the layout of routed_experts
    /// (renormalized over the k when norm_topk_prob; 0 in -1 rows). Else empty.
    std::vector<float> routed_expert_weights;
    int64_t samples() const { return static_cast<int64_t>(prompt_index.size()); }
};

// -- multi-turn episodes ----------------------------------------------------------
//
// An episode starts from a prompt; the model writes a turn (until a stop token,
// a stop string or max_tokens), the caller's environment answers it with an
// observation (tokens appended to the sequence, never trained) or ends the
// episode, and the model writes the next turn after the observation. The KV
// cache of a slot is kept across turns: the observation is appended to it
// (CausalLM::extend), never a re-prefill of the history, and the tokens the
// model sampled are kept as sampled.

/// An assistant turn has ended; the environment is asked what follows it.
struct TurnEnd {
    int64_t episode = 0;         ///< sample index, prompt-major as Generation
    int64_t turn = 0;            ///< 0-based
    std::vector<int64_t> tokens; ///< the turn's sampled tokens (its stop token included)
    std::string text;            ///< decoded, stop string excluded
    FinishReason reason = FinishReason::Stop;
    bool context_full = false; ///< no further turn fits the context: the episode ends anyway
};

/// The environment's answer to a turn.
struct TurnReply {
    bool done = false;                ///< the episode is over
    std::vector<int64_t> observation; ///< appended before the next turn (done == false)
    /// The environment failed on this episode (a tool process died, a step
    /// errored): the episode ends with EpisodeEnd::Error and this message.
    std::optional<std::string> error;
};

enum class EpisodeEnd { Done, MaxTurns, Context, Error };
/// "done", "max_turns", "context", "error"
const char *episode_end_name(EpisodeEnd e);

struct EpisodeOptions {
    int64_t max_turns = 8; ///< assistant turns per episode (>= 1)
    /// Longest prompt + turns + observations, in tokens; 0: the model's
    /// max_position_embeddings capped at 4096.
    int64_t max_context = 0;
};

struct Episode {
    std::vector<int64_t> tokens;      ///< everything after the prompt
    std::vector<float> logprobs;      ///< sampling logprobs; 0 on observation tokens
    std::vector<uint8_t> mask;        ///< 1 on sampled tokens, 0 on observations
    std::vector<int64_t> turn_starts; ///< index in tokens of each turn's first token
    std::vector<int64_t> turn_ends;   ///< one past each turn's last token
    std::vector<std::string> turn_texts;
    std::vector<FinishReason> turn_reasons;
    EpisodeEnd end = EpisodeEnd::Done;
    std::string error; ///< EpisodeEnd::Error: the environment's message
    /// With SamplingParams::return_routed_experts: the mixture-of-experts
    /// routing of every token of the episode's sequence (prompt, then
    /// `tokens`), int64 [prompt + tokens, L_moe, K] flattened, the layout of
    /// the trainer's `routed_experts` for that sequence: the prompt's rows
    /// from the prefill; an observation token's from the forward that
    /// appended it to the cache; a sampled token's from the forward that read
    /// it (the next decoding step, or, at a turn's end, the forward that
    /// appended it with the observation). The last token is never read: a
    /// row of -1, "route yourself". Else empty.
    std::vector<int64_t> routed_experts;
    /// With SamplingParams::return_expert_logits as well: the weights each
    /// row's experts were mixed with, float32 in the layout of
    /// routed_experts (0 in the -1 row). Else empty.
    std::vector<float> routed_expert_weights;
};

struct Episodes {
    std::vector<Episode> episodes;     ///< prompt-major, n per prompt
    std::vector<int64_t> prompt_index; ///< per episode
    int64_t policy_version = 0;
    int64_t routed_layers = 0, routed_k = 0; ///< L_moe and K of Episode::routed_experts
};

class Engine {
public:
    Engine(std::shared_ptr<Policy> policy, EngineConfig config = {});
    ~Engine();
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;

    /// n samples per prompt, prompt-major. Refuses (BadState) when the
    /// policy's version moved since the last sync (call sync_weights) or while
    /// asleep. With an adapter (params.adapter, else config.adapter) every
    /// forward of the call, KV-cache prefill and decode included, runs with
    /// it (read in place, like the base weights); the generation carries the
    /// adapter's version as its policy_version.
    Generation generate(const std::vector<std::vector<int64_t>> &prompts,
                        const SamplingParams &params);

    /// Multi-turn episodes, n per prompt (params.n), prompt-major. params
    /// apply per turn (max_tokens is a turn's limit). on_turn is called on
    /// this thread after every turn of every episode, in the order turns end;
    /// an exception from it propagates (use TurnReply::error to drop one
    /// episode instead). Token `j` of an episode's sampled tokens (counted over
    /// all of its turns) uses sampling_uniform(seed, prompt, sample, j): the
    /// first turn equals generate()'s sample with the same seed. With
    /// params.return_routed_experts every episode records its routing
    /// (Episode::routed_experts; refused for a model without sparse layers).
    Episodes generate_episodes(const std::vector<std::vector<int64_t>> &prompts,
                               const SamplingParams &params, const EpisodeOptions &options,
                               const std::function<TurnReply(const TurnEnd &)> &on_turn);

    /// Adopts the policy's current version and drops cached state. Returns
    /// it, or the version of the engine's default adapter (config.adapter)
    /// when it has one: the version its generations carry.
    int64_t sync_weights();
    int64_t policy_version() const;

    /// The QeRL noise sigma of the engine's current policy version
    /// (config.noise at step version - config.first_step; 0 without noise or
    /// in the first stage).
    double noise_sigma() const { return noise_sigma_; }
    /// The norm weights generate uses in place of the model's own (noisy
    /// copies, rebuilt by every sync_weights from the model's current weights
    /// with seed mix64(seed ^ mix64(version))); empty when noise_sigma() is 0.
    const NormWeights &noisy_norms() const { return noisy_norms_; }

    /// Frees the KV cache / allocates it again.
    void sleep();
    void wake_up();
    bool asleep() const { return asleep_; }
    /// Bytes the KV cache holds now.
    int64_t cache_bytes() const;
    /// The KV budget: kv_cache_fraction of the device's memory.
    int64_t kv_budget_bytes() const;

private:
    void ensure_cache(int64_t slots, int64_t capacity);
    /// A call's checked settings: stop ids, adapter, seed, samples per wave.
    struct Prepared {
        std::vector<int64_t> stop_ids;
        std::shared_ptr<LoraAdapter> adapter;
        uint64_t seed = 0;
        int64_t wave = 0;
    };
    Prepared prepare(const std::vector<std::vector<int64_t>> &prompts, const SamplingParams &params,
                     int64_t capacity, const char *fn);
    at::Tensor prefill_wave(const std::vector<std::vector<int64_t>> &prompts, int64_t n,
                            int64_t first_sample, int64_t end_sample,
                            std::vector<detail::Sequence> *seqs);
    void run_episode_wave(const std::vector<std::vector<int64_t>> &prompts,
                          const SamplingParams &params, const Prepared &prep, int64_t first_sample,
                          int64_t end_sample, int64_t capacity, const EpisodeOptions &options,
                          const std::function<TurnReply(const TurnEnd &)> &on_turn,
                          std::vector<Episode> &out);
    void run_wave(const std::vector<std::vector<int64_t>> &prompts, const SamplingParams &params,
                  const Prepared &prep, int64_t first_sample, int64_t end_sample, Generation &g);

    std::shared_ptr<Policy> policy_;
    EngineConfig config_;
    int64_t version_ = 0;
    bool asleep_ = false;
    std::optional<KVCache> cache_;
    double noise_sigma_ = 0;
    NormWeights noisy_norms_;
    void refresh_noise();
};

} // namespace rl::core
