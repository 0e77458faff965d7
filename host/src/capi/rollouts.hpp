// Rollouts from any generator: the engine in process (rl_rollouts_generate,
// rl_rollouts_generate_episodes) or an inference server
// (rl_inference_client_rollouts). Internal to librl.
#pragma once

#include "batch.hpp"
#include "train_common.hpp"

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

struct rl_rollouts {
    struct Item {
        std::string task; // the task as JSON text
        int64_t group_id = 0;
        int64_t prompt_index = 0;
        std::vector<int64_t> prompt_ids, token_ids;
        std::vector<float> logprobs; // per completion token (0 on observations)
        // Per completion token: 1 sampled, 0 an observation (multi-turn
        // episodes); empty: every token was sampled.
        std::vector<uint8_t> completion_mask;
        std::string text, finish_reason;
        int64_t policy_version = 0;
        std::optional<double> sampling_temperature; // 0: greedy
        bool scored = false;
        double reward = 0;
        std::map<std::string, double> metrics; // env metrics
        std::vector<std::string> flags;        // filter reasons
        bool masked = false;
        // Multi-turn episodes: each turn's [start, end) in token_ids and the
        // reward its step gave; the environment's error when it failed.
        std::vector<int64_t> turn_starts, turn_ends;
        std::vector<double> turn_rewards;
        std::string error;
        bool episode = false;
        // Routing replay (R3, sampling.return_routed_experts): the experts of
        // every sparse layer for each token of prompt_ids + token_ids,
        // [prompt + completion, routed_layers, routed_k] flattened, as the
        // engine recorded them (-1 rows: never read); empty: not recorded.
        std::vector<int32_t> routed_experts;
        int64_t routed_layers = 0, routed_k = 0;
        // With sampling.return_expert_logits as well: the weights the
        // sampler mixed those experts with, float32 in the layout of
        // routed_experts (0 in -1 rows); empty: not recorded.
        std::vector<float> routed_expert_weights;
    };
    std::vector<Item> items;
    int64_t groups = 0;
    int64_t vocab_size = 0;
    // Episodes generated with "turn_rewards": "tokens": their batches carry
    // per-token "token_rewards" (each turn's reward on its last token).
    bool turn_token_rewards = false;
};

namespace rl::host::capi {

/// The options rl_rollouts_generate takes (and rl_rollouts_generate_episodes
/// with its own keys besides).
struct RolloutOptions {
    std::string chat_template = "none";
    nlohmann::json chat_vars;
    int64_t group_offset = 0;
    bool parse_special = false;
    nlohmann::json sampling = nlohmann::json::object();
    nlohmann::json rest = nlohmann::json::object(); ///< the `extra` keys given
};
/// Reads options_json; a key that is neither one of rl_rollouts_generate's
/// nor in `extra` is an error naming `fn` and listing the valid keys.
RolloutOptions read_rollout_options(const char *options_json, const char *fn,
                                    const std::vector<std::string> &extra = {});

/// The prompt ids of each task (see rl_rollouts_generate): its "prompt",
/// wrapped by the chat template when one is named, with the task's "tools"
/// (a JSON array of tool schemas) given to the model's own template.
std::vector<std::vector<int64_t>> encode_prompts(const core::Tokenizer &tok,
                                                 const nlohmann::json &tasks,
                                                 const RolloutOptions &o, const char *fn);

/// What a supervised batch starts from (rl_train_batch_supervised and its
/// episode form): the tasks, the options' chat template settings, the
/// tokenizer, the end-of-sequence id and the encoded prompts.
struct Supervised {
    nlohmann::json tasks;
    RolloutOptions options;
    const core::Tokenizer *tok = nullptr;
    int64_t eos = 0;
    std::vector<std::vector<int64_t>> prompts;
};
/// Reads the arguments of rl_train_batch_supervised (options chat_template,
/// chat_template_kwargs, eos_token_id, parse_special_tokens).
Supervised read_supervised(rl_model_t *model, const char *tasks_json, const char *options_json,
                           const char *fn);
/// A supervised batch: one sequence (and group) per task, rewards 0.
std::unique_ptr<rl_train_batch>
supervised_batch(const rl_model_t *model, const nlohmann::json &tasks,
                 const std::vector<int64_t> &ids, const std::vector<int64_t> &cu,
                 const std::vector<float> &mask, const std::vector<std::string> &completions);

/// The tasks argument of a verb: a non-empty JSON array.
nlohmann::json tasks_arg(const char *tasks_json, const char *fn);

/// Encodes the tasks' prompts as the options say (chat_template,
/// chat_template_kwargs, parse_special_tokens), samples them with
/// options.sampling through `generate` and returns the rollouts (owned by the
/// caller). Errors name `fn`.
rl_rollouts_t *
generate_rollouts(const core::Tokenizer &tok, int64_t vocab_size, const char *tasks_json,
                  const char *options_json, const char *fn,
                  const std::function<core::Generation(const std::vector<std::vector<int64_t>> &,
                                                       const core::SamplingParams &)> &generate);

} // namespace rl::host::capi
