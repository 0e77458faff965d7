// rl/core/sampling.hpp: the engine's sampling rules.
//
// From the next-token logits z (fp32) the sampling distribution is built in
// this order: temperature (z / T; T = 0 means greedy), top-k (keep the k
// largest; exactly k, ties broken by index), top-p (keep the smallest prefix
// of the remaining tokens, by decreasing probability, whose mass reaches p),
// then renormalize. The engine reports, for each sampled token, its
// log-probability under THAT distribution (after temperature, top-k and
// top-p): the behaviour policy the token was actually drawn from, which is
// what importance ratios against rollout logprobs need. With temperature 1
// and no top-k / top-p it equals the trainer's logprobs of the token. Greedy
// decoding (temperature 0 or top_k 1) reports 0.
//
// Randomness is counter-based: the uniform that draws token `position` of
// sample `sample` of prompt `prompt` is a hash of (seed, prompt, sample,
// position), so results do not depend on batch composition or wave size.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rl::core {

struct SamplingParams {
    int64_t n = 1;
    double temperature = 1.0;
    double top_p = 1.0;
    int64_t top_k = 0;            ///< 0: off
    std::optional<uint64_t> seed; ///< none: the next seed of the policy's stream
    int64_t max_tokens = 32;
    std::vector<std::string> stop; ///< stop strings (excluded from the text)
    /// Stop token ids (kept in the tokens, excluded from the text); none: the
    /// model's EOS ids.
    std::optional<std::vector<int64_t>> stop_token_ids;
    /// The LoRA adapter to sample with, by its name in the policy's registry
    /// (docs/lora.md); empty: the engine's default (EngineConfig::adapter).
    std::string adapter;
    /// Record the mixture-of-experts routing of every token (Engine::generate,
    /// generate_episodes and the serving scheduler; Generation::routed_experts,
    /// docs/model.md "Mixture of experts").
    bool return_routed_experts = false;
    /// With return_routed_experts, also record the weights the experts were
    /// mixed with (xorl-sglang's return_expert_logits; Engine::generate and
    /// the serving scheduler; Generation::routed_expert_weights).
    bool return_expert_logits = false;

    /// JSON object with the keys above (all optional); unknown keys and bad
    /// values are errors naming the key.
    static SamplingParams from_json(const std::string &json_text);
    void validate() const;
    bool greedy() const { return temperature == 0.0 || top_k == 1; }
};

/// Uniform double in [0, 1) from a counter-based hash.
double sampling_uniform(uint64_t seed, int64_t prompt, int64_t sample, int64_t position);

/// Log-probabilities of the sampling distribution for each row of logits
/// [rows, vocab] (fp32): -inf for tokens outside the kept set.
at::Tensor sampling_logprobs(const at::Tensor &logits, const SamplingParams &params);

/// Draws one token per row of `logprobs` (as sampling_logprobs returns) by
/// inverse CDF over the vocabulary with uniforms `u`. Returns (token, logprob).
/// Host tensors run a sequential loop; device tensors draw_tokens_batched.
std::vector<std::pair<int64_t, float>> draw_tokens(const at::Tensor &logprobs,
                                                   const std::vector<double> &u);
/// The same rule as tensor operations on the tensor's own device (cumulative
/// sum, search, gather): only the picks cross to the host.
std::vector<std::pair<int64_t, float>> draw_tokens_batched(const at::Tensor &logprobs,
                                                           const std::vector<double> &u);

} // namespace rl::core
