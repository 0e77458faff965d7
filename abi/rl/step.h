/* abi/rl/step.h: one RL step as typed values, one call per verb (DESIGN.md,
 * "One RL step, as data"):
 *
 *   rl_rollouts_generate  tasks -> prompts (chat template) -> n samples each
 *   rl_rollouts_score     env plugin: reward + env metrics per rollout
 *   rl_rollouts_set_rewards  rewards from elsewhere (reward model, judge, shaping)
 *   rl_rollouts_filter    filter plugins: verdicts; an enforcing filter masks
 *   rl_buffer_push_rollouts   into the rollout buffer (difficulty filter,
 *                         staleness; train.h)
 *   rl_buffer_pop_train_batch complete groups -> one training batch
 *   rl_train_batch_compute_advantages  advantage plugin -> "advantages"
 *   rl_train_batch_view   the batch as an rl_batch_t for rl_trainer_forward_backward
 *   rl_sync_weights       engine adopts the trainer's weights, buffer the version
 *
 * Lua, Python and C compose these verbs; no per-token work is left to the
 * caller. Same conventions as train.h: status returns, rl_last_error(),
 * opaque handles, JSON options, rl_result_t outputs. */
#ifndef RL_STEP_H
#define RL_STEP_H

#include <stdint.h>
#include "macros.h"
#include "runtime.h"
#include "status.h"
#include "train.h"
#include "types.h"

RL_EXTERN_C_BEGIN

/* The rollouts of one step: for each task, `n` samples of one prompt (a group).
 * Each rollout holds the task, its group id, the prompt and completion token
 * ids, the sampling log-probs of the completion, the decoded text, the finish
 * reason, the policy version that sampled it, and (once scored / filtered) its
 * reward, env metrics, filter flags and whether it is masked from the loss. */
typedef struct rl_rollouts rl_rollouts_t;

/* A training batch taken from the buffer: packed sequences (prompt +
 * completion), per-token "loss_mask" (float32; 0 on prompts and masked
 * rollouts), "old_logprobs" (float32 sampling log-probs at each completion
 * token's position, 0 on prompts), any extra per-token tensors pushed, and per
 * sequence rewards, group ids and policy versions. */
typedef struct rl_train_batch rl_train_batch_t;

/* [control-thread] (since 0.1) Encode each task's "prompt" (tasks_json: JSON array of task
 * objects as rl_env_sample returns them), wrapped by the chat template when one
 * is named, and sample n completions per prompt with `engine`.
 * options_json (may be NULL): {"chat_template": "none" | "model" | "chatml" |
 * "llama3" (default "none": the prompt as it is; "model": the model's own
 * Jinja template, see rl_tokenizer_apply_chat_template),
 * "chat_template_kwargs": {extra template variables, e.g. "enable_thinking":
 * false}, "group_offset": int (group id of the first task; the next
 * tasks count up from it; default 0), "sampling": {the parameters of
 * rl_engine_generate: n, temperature, top_p, top_k, max_tokens, stop, seed,
 * stop_token_ids}, "parse_special_tokens": bool (default false: the task's
 * text is plain text, special-token text in it never becomes a control token;
 * only the chat template's own special tokens are)}. Rollouts are
 * prompt-major: samples of task i are rollouts i*n .. i*n + n - 1. Each
 * rollout records the sampling temperature (0 for greedy decoding) and the
 * training batches made of it carry it to the trainer (rl_batch_t). */
RL_API rl_status_t rl_rollouts_generate(rl_engine_t *engine, const char *tasks_json,
                                        const char *options_json, rl_rollouts_t **out_rollouts);
/* [control-thread] (since 0.9) Multi-turn episodes: for each task, n episodes
 * (a group). An episode starts from the task's prompt (encoded as
 * rl_rollouts_generate does; a task's "tools", a JSON array of tool schemas,
 * go to the model's own chat template); after every assistant turn `env` (an
 * instance of kind "env" with a step(), kinds/env.h) answers through
 * rl_env_step, and its observation is appended as the chat template renders a
 * message of its role after the turn ("none": the observation's text as it
 * is), until the env says done, max_turns, or the context is full. The engine
 * continues each episode from its KV cache; the sampled tokens are kept as
 * sampled. options_json: those of rl_rollouts_generate (sampling.max_tokens
 * limits one turn), plus "max_turns" (default 8) and "max_context" (prompt +
 * turns + observations in tokens; default 0: the model's context, at most
 * 4096). Each rollout's completion is the whole episode after the prompt: its
 * loss mask is 1 on sampled tokens and 0 on observations; its reward is the sum
 * of its turns' rewards (scored: rl_rollouts_score refuses these rollouts).
 * (API 0.10) "turn_rewards": "tokens" (default "episode") also gives their
 * batches a per-token "token_rewards" tensor, each turn's reward on the turn's
 * last token, which rl_train_batch_compute_advantages hands to the estimator
 * (with the sequence rewards less those token rewards, so each turn counts
 * once) and then removes from the batch;
 * finish reasons "done", "max_turns", "context" or "error". An env step that
 * fails drops only its episode: reason "error", flag "env_error", masked,
 * reward 0, the message in rl_rollouts_info's "errors". */
RL_API rl_status_t rl_rollouts_generate_episodes(rl_engine_t *engine, rl_instance_t *env,
                                                 const char *tasks_json, const char *options_json,
                                                 rl_rollouts_t **out_rollouts);
/* [control-thread] (since 0.1) NULL is a no-op. */
RL_API void rl_rollouts_destroy(rl_rollouts_t *rollouts);

/* [control-thread] (since 0.1) Score every rollout with `env` (an instance of kind "env"):
 * its reward and env metrics. A non-finite reward is an error naming the
 * rollout and the env. */
RL_API rl_status_t rl_rollouts_score(rl_rollouts_t *rollouts, rl_instance_t *env);

/* [control-thread] (since 0.8) Set every rollout's reward: rollout i gets rewards[i] (n
 * must be the number of rollouts, every value finite; the rewards are copied).
 * The rollouts count as scored afterwards; env metrics an earlier
 * rl_rollouts_score recorded stay. For rewards computed outside an env plugin:
 * a reward model, an LLM judge, or shaping of the env's rewards (read them
 * with rl_rollouts_info, change, set). Since API 0.8. */
RL_API rl_status_t rl_rollouts_set_rewards(rl_rollouts_t *rollouts, const double *rewards,
                                           uint64_t n);

/* [control-thread] (since 0.1) Run every filter (instances of kind "filter") on every
 * rollout's completion. A flagged rollout records the filter's reason; when the
 * filter instance enforces (its `enforce` setting, owned by the filter, not the
 * caller), the rollout is masked: none of its tokens reach the loss. Result:
 * scalars "flagged" and "masked" (rollouts), "flagged.<reason>" (per reason). */
RL_API rl_status_t rl_rollouts_filter(rl_rollouts_t *rollouts, rl_instance_t *const *filters,
                                      uint64_t n_filters, rl_result_t **out_result);

/* [thread-safe] (since 0.1) What the rollouts hold. Scalars "rollouts", "groups", "tokens"
 * (completion tokens), "flagged", "masked", and when scored "reward_mean",
 * "reward_std" (population), "reward_min", "reward_max" and "env/<metric>" (the
 * mean of each env metric), "sampling_temperature"; tensors "rewards" (float64), "group_ids",
 * "prompt_index", "policy_versions", "completion_lengths" (int64), "masked"
 * (uint8), one entry per rollout; texts "completions", "finish_reasons",
 * "tasks" (JSON arrays, one entry per rollout) and "flags" (JSON array of
 * arrays of reasons). Episodes (rl_rollouts_generate_episodes) add tensor
 * "turns" (int64), scalars "turns_mean" and "episode_errors", texts
 * "turn_rewards" (JSON array of arrays), "turn_spans" (per rollout, each turn's
 * [start, end) in its completion tokens: the tokens between are observations)
 * and "errors" (JSON array, "" when none). */
RL_API rl_status_t rl_rollouts_info(const rl_rollouts_t *rollouts, rl_result_t **out_result);

/* [thread-safe] (since 0.1) Push every scored rollout into the buffer as one sequence:
 * token ids = prompt then completion, logprobs 0 on the prompt then the
 * sampling log-probs, loss mask 0 on the prompt and 1 on the completion (0 when
 * masked). Unscored rollouts are refused. Result: scalar "pushed". The buffer
 * drops stale rollouts and groups without learning signal (its difficulty
 * filter, the only one). */
RL_API rl_status_t rl_buffer_push_rollouts(rl_buffer_t *buffer, const rl_rollouts_t *rollouts,
                                           rl_result_t **out_result);

/* [thread-safe] (since 0.1) Every scored rollout as one training batch, in rollout order,
 * without the buffer (on-policy uses such as distillation that train on every
 * sample); same layout as rl_buffer_pop_train_batch. */
RL_API rl_status_t rl_rollouts_to_batch(const rl_rollouts_t *rollouts,
                                        rl_train_batch_t **out_batch);

/* [control-thread] (since 0.2) A supervised batch on the tasks' reference answers
 * (tasks_json: JSON array of tasks with string "prompt" and "answer"): per
 * sequence the prompt (wrapped by the chat template when one is named), then
 * the answer followed by a newline, then the end-of-sequence token; tensor
 * "loss_mask" (float32) is 1 on the answer, newline and EOS tokens.
 * options_json (may be NULL): {"chat_template": "none" | "model" | "chatml" |
 * "llama3", "chat_template_kwargs": {...} (as rl_rollouts_generate),
 * "eos_token_id": int (default: the model's first EOS id),
 * "parse_special_tokens": bool (default false: prompt and answer are plain
 * text, as in rl_rollouts_generate)}. `model` may be a tokenizer alone
 * (rl_tokenizer_load). */
RL_API rl_status_t rl_train_batch_supervised(rl_model_t *model, const char *tasks_json,
                                             const char *options_json,
                                             rl_train_batch_t **out_batch);

/* [control-thread] (since 0.9) A supervised batch of reference episodes, the
 * multi-turn form of rl_train_batch_supervised: each task's
 * metadata.reference_turns (a non-empty JSON array of assistant turns) is
 * played against `env` (its step() answers each turn but the last), and the
 * sequence is laid out as rl_rollouts_generate_episodes lays out an episode:
 * prompt, turn + newline + EOS (loss mask 1), the env's observation rendered
 * by the chat template (mask 0), the next turn, ... Same options as
 * rl_train_batch_supervised. An env that ends the episode before the last
 * reference turn is an error naming the task. */
RL_API rl_status_t rl_train_batch_supervised_episodes(rl_model_t *model, rl_instance_t *env,
                                                      const char *tasks_json,
                                                      const char *options_json,
                                                      rl_train_batch_t **out_batch);

/* [thread-safe] (since 0.1) Wait up to timeout_ms (0: do not wait) until at least
 * min_rollouts rollouts of complete, kept groups are ready, then take every
 * ready group as one training batch (sequences group-major). *out_batch is
 * NULL when fewer are ready (they stay for a later call).
 * In a distributed run (dist.h) this is a collective: min_rollouts counts the
 * ready rollouts of all ranks, each rank waits up to timeout_ms for one of its
 * own, and either every rank takes its ready groups (at least one each) or
 * none does, so the ranks train in step. */
RL_API rl_status_t rl_buffer_pop_train_batch(rl_buffer_t *buffer, uint64_t min_rollouts,
                                             uint64_t timeout_ms, rl_train_batch_t **out_batch);
/* [control-thread] (since 0.1) NULL is a no-op. */
RL_API void rl_train_batch_destroy(rl_train_batch_t *batch);

/* [control-thread] (since 0.1) Compute per-token advantages with `advantage` (an instance
 * of kind "advantage") from the batch's rewards, group ids, cu_seqlens and loss
 * mask, and store them in the batch as tensor "advantages" (replacing any).
 * Result: the plugin's result (tensor "advantages", its metrics). */
RL_API rl_status_t rl_train_batch_compute_advantages(rl_train_batch_t *batch,
                                                     rl_instance_t *advantage,
                                                     rl_result_t **out_result);

/* [control-thread] (since 0.1) Add or replace per-token tensor `name` (float32 / float64,
 * one value per token; copied), e.g. "teacher_logprobs" or "ref_logprobs" from
 * another model's rl_trainer_forward. "input_ids" and "cu_seqlens" cannot be
 * replaced. */
RL_API rl_status_t rl_train_batch_set_tensor(rl_train_batch_t *batch, const char *name,
                                             const rl_tensor_view_t *tensor);

/* [thread-safe] (since 0.1) Split into at most k minibatches of consecutive sequences,
 * about equal in sequence count, never splitting a group (PPO epochs over
 * minibatches). out_parts must hold k entries; *out_count receives how many
 * were made (each to be destroyed by the caller). */
RL_API rl_status_t rl_train_batch_split(const rl_train_batch_t *batch, uint64_t k,
                                        rl_train_batch_t **out_parts, uint64_t *out_count);

/* [thread-safe] (since 0.1) The batch as trainer input: out_batch->input_ids, cu_seqlens
 * and tensors ("loss_mask", "old_logprobs", "advantages" once computed, the
 * extras) are views into the batch, valid until it is destroyed or changed;
 * when out_batch has room for them (API 0.3), flags and sampling_temperature
 * (the rollouts' sampling temperature, when they carry one). Set
 * out_batch->struct_size first (sizeof(rl_batch_t)).
 * [owned by librl until the batch is destroyed or changed: out_batch] */
RL_API rl_status_t rl_train_batch_view(const rl_train_batch_t *batch, rl_batch_t *out_batch);

/* [thread-safe] (since 0.1) Scalars "groups", "rollouts", "tokens" (all positions),
 * "loss_tokens", "min_policy_version", "sampling_temperature" (when the
 * rollouts carry one); tensors "rewards" (float64), "group_ids",
 * "policy_versions" (int64), one per sequence, and copies of the per-token
 * tensors; texts "tasks", "completions" (JSON arrays, one per sequence). */
RL_API rl_status_t rl_train_batch_info(const rl_train_batch_t *batch, rl_result_t **out_result);

/* [control-thread] (since 0.1) Weight sync, one call: the engine adopts the trainer's
 * current weights and policy version (co-located: no copy) and drops its
 * cached state; the buffer (may be NULL) learns the new version and drops what
 * became stale. Scalar "policy_version". */
RL_API rl_status_t rl_sync_weights(rl_engine_t *engine, rl_buffer_t *buffer,
                                   rl_result_t **out_result);

RL_EXTERN_C_END

#endif /* RL_STEP_H */
