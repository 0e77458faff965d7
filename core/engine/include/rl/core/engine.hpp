// rl/core/engine.hpp: the co-located rollout engine. Batched generation over
// the model core's KV cache, reading the policy's parameters in place (the
// same CausalLM object the trainer optimizes: weight sync is adopting the new
// policy version and dropping cached state, no copy). Sampling rules are in
// sampling.hpp.
//
// One generate call: every prompt is prefilled once into a cache slot and the
// slot copied to its n samples; then one decode step per token runs all
// unfinished samples together. With max_batch_sequences > 0 the samples are
// run in waves of at most that many slots. Generation runs under
// c10::InferenceMode (no autograd state is recorded).
#pragma once

#include "rl/core/kv_cache.hpp"
#include "rl/core/policy.hpp"
#include "rl/core/sampling.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rl::core {

struct EngineConfig {
    int64_t max_batch_sequences = 0; ///< samples decoded together; 0: all of a call
    /// KV-cache budget: this fraction of the device's memory (GPU memory on
    /// CUDA, physical RAM on the CPU). Calls whose samples do not fit run in
    /// waves that do; one sample that does not fit is an error.
    double kv_cache_fraction = 0.3;
    /// The LoRA adapter generate uses when a call names none (its name in
    /// the policy's registry); empty: the base model.
    std::string adapter;
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
    int64_t samples() const { return static_cast<int64_t>(prompt_index.size()); }
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

    /// Adopts the policy's current version and drops cached state. Returns
    /// it, or the version of the engine's default adapter (config.adapter)
    /// when it has one: the version its generations carry.
    int64_t sync_weights();
    int64_t policy_version() const;

    /// Frees the KV cache / allocates it again.
    void sleep();
    void wake_up();
    bool asleep() const { return asleep_; }
    /// Bytes the KV cache holds now.
    int64_t cache_bytes() const;
    /// The KV budget: kv_cache_fraction of the device's memory.
    int64_t kv_budget_bytes() const;

private:
    struct SampleOut;
    void ensure_cache(int64_t slots, int64_t capacity);
    void run_wave(const std::vector<std::vector<int64_t>> &prompts, const SamplingParams &params,
                  uint64_t seed, const std::vector<int64_t> &stop_ids, int64_t first_sample,
                  int64_t end_sample, std::vector<SampleOut> &out);

    std::shared_ptr<Policy> policy_;
    EngineConfig config_;
    int64_t version_ = 0;
    bool asleep_ = false;
    std::optional<KVCache> cache_;
};

} // namespace rl::core
