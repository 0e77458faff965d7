/* abi/rl/train.h: models, tokenizers, the trainer and the co-located rollout
 * engine, exported by librl. Same conventions as runtime.h: status returns,
 * rl_last_error() on failure, opaque handles, JSON parameters, rl_result_t
 * outputs. The verbs mirror the xorl / Tinker training API: forward,
 * forward_backward, optim_step, save / load, sync_inference_weights, sleep /
 * wake_up. */
#ifndef RL_TRAIN_H
#define RL_TRAIN_H

#include <stdint.h>
#include "macros.h"
#include "runtime.h"
#include "status.h"
#include "tensor.h"
#include "types.h"

RL_EXTERN_C_BEGIN

typedef struct rl_model rl_model_t;     /* weights + config + tokenizer of one HF model */
typedef struct rl_trainer rl_trainer_t; /* optimizer state over a model's parameters */
typedef struct rl_engine rl_engine_t;   /* rollout engine reading a model's parameters */

/* ---- platform ------------------------------------------------------------------ */

/* [thread-safe] (since 0.1) The tensor platform under the trainer and engine, as a static
 * NUL-terminated JSON text owned by librl: {"torch_version": "2.15.0+cu132",
 * "cuda_built": true, "cuda_devices": 0, "summary": "libtorch ..., CUDA not
 * usable (...)"}. [static] */
RL_API const char *rl_platform_info(void);

/* ---- models ----------------------------------------------------------------- */

/* [control-thread] (since 0.1) Write the built-in model `preset` ("tiny"; (API 0.10)
 * "tiny-reward": its trunk as a Qwen3ForSequenceClassification with one
 * label) as a complete HF folder (config.json, model.safetensors,
 * tokenizer.json) at `dir`, with a seeded random init. The folder loads with
 * rl_model_load. */
RL_API rl_status_t rl_model_init_preset(const char *preset, const char *dir, uint64_t seed);

/* [control-thread] (since 0.1) Load an HF model folder. options_json (may be NULL):
 * {"threads": 0 (all cores), "device": "auto" | "cpu" | "cuda" | "cuda:N" (default
 * "cpu"), "dtype": "float32" (default) | "bfloat16", "value_head": false,
 * "value_head_seed": 0}. With bfloat16 the trainer keeps float32 master
 * weights and optimizer state. A CUDA device that is not usable is an error
 * naming the reason. "value_head": true gives the policy a scalar critic head
 * on its trunk (the folder's value_head.safetensors when present, else a
 * seeded init; docs/model.md): trainers then compute the loss input "values"
 * from it (differentiable) and save it with checkpoints and rl_model_save. */
RL_API rl_status_t rl_model_load(const char *path, const char *options_json,
                                 rl_model_t **out_model);
/* [control-thread] (since 0.1) NULL is a no-op. Trainers and engines of the model must be
 * destroyed first (they keep it). */
RL_API void rl_model_destroy(rl_model_t *model);

/* [thread-safe] (since 0.1) Text "info": JSON {"architecture", "vocab_size", "num_parameters",
 * "hidden_size", "num_layers", "eos_token_ids": [...], "policy_version", "device",
 * "dtype", "value_head": true | false, (API 0.10) "task": "causal_lm" |
 * "sequence_classification", "num_labels" (0 for a causal LM)}. A reward model
 * (a ...ForSequenceClassification folder; "architecture" is that class) has a
 * score head instead of a language-model head: it takes no engine, no
 * value head and no trainer other than a forward-only one. */
RL_API rl_status_t rl_model_info(rl_model_t *model, rl_result_t **out_result);

/* [control-thread] (since 0.1) Save weights, config and tokenizer as an HF folder, atomically
 * (a complete folder or none). */
RL_API rl_status_t rl_model_save(rl_model_t *model, const char *dir);

/* ---- tokenizer ----------------------------------------------------------------- */

/* The tokenizer calls take an rl_model_t from rl_model_load or a tokenizer
 * alone from rl_tokenizer_load. */

/* [control-thread] (since 0.3) A tokenizer without a model: `dir` holds tokenizer.json
 * (and optionally tokenizer_config.json / chat_template.jinja for the chat
 * format and EOS token). No weights are read. The handle works with every
 * rl_tokenizer_* call, rl_model_info ({"has_model": false, "has_tokenizer":
 * true, "vocab_size", "eos_token_ids"}) and rl_train_batch_supervised; calls
 * that need weights (rl_trainer_create, rl_engine_create, rl_model_save)
 * refuse it with RL_ERR_BAD_STATE. Destroy with rl_model_destroy. (API 0.3) */
RL_API rl_status_t rl_tokenizer_load(const char *dir, rl_model_t **out_tokenizer);

enum {
    RL_ENCODE_ADD_SPECIAL = 1u << 0, /* add the tokenizer's BOS-style tokens */
    /* Special-token text in the input ("<|im_end|><|im_start|>system") is
     * encoded as plain text, never as control tokens: for text a user or an
     * environment wrote. (API 0.3) */
    RL_ENCODE_PLAIN_TEXT = 1u << 1
};

/* [thread-safe] (since 0.1) Tensor "ids": int64 [n]. Without RL_ENCODE_PLAIN_TEXT, special
 * tokens written in the text are parsed (Hugging Face's default). */
RL_API rl_status_t rl_tokenizer_encode(rl_model_t *model, rl_string_view_t text, uint32_t flags,
                                       rl_result_t **out_result);
/* [thread-safe] (since 0.1) Text "text". Special tokens are rendered as their text. */
RL_API rl_status_t rl_tokenizer_decode(rl_model_t *model, const int64_t *ids, uint64_t n,
                                       rl_result_t **out_result);

enum { RL_DECODE_SKIP_SPECIAL = 1u << 0 }; /* leave special tokens out of the text */

/* [thread-safe] (since 0.3) rl_tokenizer_decode with flags (RL_DECODE_*). (API 0.3) */
RL_API rl_status_t rl_tokenizer_decode_v2(rl_model_t *model, const int64_t *ids, uint64_t n,
                                          uint32_t flags, rl_result_t **out_result);

/* [thread-safe] (since 0.3) The conversation rendered by the chat template (as
 * rl_tokenizer_apply_chat_template: text "prompt") and encoded: tensor "ids".
 * flags: RL_ENCODE_PLAIN_TEXT keeps special-token text inside the messages'
 * contents plain while the template's own special tokens stay control
 * tokens; the ids equal those of encoding "prompt" whenever the contents hold
 * no special-token text. A template that does not render each content once,
 * unchanged, is refused with that flag. (API 0.3) */
RL_API rl_status_t rl_tokenizer_encode_chat(rl_model_t *model, const char *messages_json,
                                            const char *template_name,
                                            uint32_t add_generation_prompt, uint32_t flags,
                                            rl_result_t **out_result);
/* [thread-safe] (since 0.1) Text "prompt": the conversation rendered by a chat template.
 * template: NULL or "model": the model's own Jinja chat_template
 * (tokenizer_config.json or chat_template.jinja), rendered as transformers'
 * apply_chat_template renders it; messages_json is a JSON array of message
 * objects passed to it as they are ({"role": str, "content": str | array |
 * null, plus tool_calls, reasoning_content, ... when the template reads them}).
 * An error names the template line when the template uses a construct the
 * engine does not support (docs/model.md), or when the model has none.
 * "chatml" or "llama3": a built-in format; contents must be strings and roles
 * system, user or assistant. */
RL_API rl_status_t rl_tokenizer_apply_chat_template(rl_model_t *model, const char *messages_json,
                                                    const char *template_name,
                                                    uint32_t add_generation_prompt,
                                                    rl_result_t **out_result);
/* [thread-safe] (since 0.2) rl_tokenizer_apply_chat_template with options. options_json
 * (may be NULL): {"template": "model" (default) | "chatml" | "llama3",
 * "add_generation_prompt": bool (default true), "tools": [tool schemas: the
 * template's `tools`], "chat_template_kwargs": {extra template variables, e.g.
 * "enable_thinking": false}}; tools and chat_template_kwargs need the model's
 * own template. Text "prompt". */
RL_API rl_status_t rl_tokenizer_render_chat(rl_model_t *model, const char *messages_json,
                                            const char *options_json, rl_result_t **out_result);

/* ---- trainer ----------------------------------------------------------------- */

/* A batch of sequences: token ids back to back plus per-token tensors aligned
 * with them. Position t of a per-token tensor describes token t as predicted
 * from the tokens before it in its sequence: "logprobs" computed by the trainer
 * at t are log p(input_ids[t] | input_ids[start..t-1]); the first token of
 * each sequence has no prediction and never counts in a loss. Typical tensors:
 * "loss_mask" (1 on completion tokens), "advantages", "old_logprobs",
 * "ref_logprobs", "labels" (int64, -100 = ignored; default input_ids).
 * Gradient accumulation over several calls: add two 1-element float tensors
 * "global_tokens" (loss tokens of the whole optimizer step) and "global_seqs"
 * (sequences with at least one loss token in the step); the loss normalizes by
 * them so the calls add up to one full-batch gradient. Absent: this call's
 * own counts.
 *
 * Temperature (API 0.3): with RL_BATCH_HAS_SAMPLING_TEMPERATURE in `flags`,
 * `sampling_temperature` is the temperature the completions were sampled at
 * (0: greedy) and the trainer divides the logits by it before the log-softmax
 * of "logprobs" and "entropy", so they are the sampling distribution's (top-k
 * / top-p truncation is not applied: the untruncated tempered distribution is
 * scored). An explicit trainer.logprob_temperature that differs is an error;
 * a greedy batch is scored at trainer.logprob_temperature (else 1) with a
 * warning. Without the flag: trainer.logprob_temperature, else 1. A struct of
 * the 0.1 layout (struct_size = RL_SIZE_THROUGH(rl_batch_t, tensors)) is
 * accepted and carries no temperature. rl_train_batch_view fills both fields. */
enum { RL_BATCH_HAS_SAMPLING_TEMPERATURE = 1u << 0 };

typedef struct rl_batch {
    uint32_t struct_size;
    uint32_t reserved0;          /* 0 */
    rl_tensor_view_t input_ids;  /* int64 [n_tokens]; borrowed */
    rl_tensor_view_t cu_seqlens; /* int64 [n_seqs + 1]; borrowed */
    rl_tensor_list_t tensors;    /* per-token [n_tokens]; borrowed */
    /* ---- API 0.3: read with RL_HAS_FIELD(batch, rl_batch_t, sampling_temperature) ---- */
    uint32_t flags;              /* RL_BATCH_*; 0: none */
    uint32_t reserved1;          /* 0 */
    double sampling_temperature; /* >= 0; read when flags has RL_BATCH_HAS_SAMPLING_TEMPERATURE */
} rl_batch_t;

/* [control-thread] (since 0.1) A trainer over `model`'s parameters. config_json: the
 * "trainer" section of the run configuration (docs/configuration.md) plus
 * optional "total_steps" (for schedules) and "seed". (API 0.5) LoRA: with
 * "adapter": name the trainer trains that adapter of the model and nothing
 * else (the base weights are frozen); with "lora": {config as
 * rl_adapter_create} it first creates the adapter ("adapter" names it,
 * default "default"; a taken name is an error). Its optim_step reports the
 * adapter's version as "policy_version"; its checkpoints hold the adapter.
 * [kept until rl_trainer_destroy: model] */
RL_API rl_status_t rl_trainer_create(rl_model_t *model, const char *config_json,
                                     rl_trainer_t **out_trainer);
/* [control-thread] (since 0.1) NULL is a no-op. */
RL_API void rl_trainer_destroy(rl_trainer_t *trainer);

/* [control-thread] (since 0.1) Forward + backward through `loss` (an instance of kind
 * "loss"); gradients accumulate until rl_trainer_optim_step. The batch is packed
 * into bins of trainer.sample_packing_sequence_len tokens and run in
 * micro-batches of trainer.micro_batch_tokens. Result: scalars "loss", "tokens",
 * "seqs", "logprob_temperature" (the temperature the logprobs were computed at,
 * see rl_batch_t); the loss's metrics (token-weighted means over
 * micro-batches); the loss's extra per-token tensors. */
RL_API rl_status_t rl_trainer_forward_backward(rl_trainer_t *trainer, const rl_batch_t *batch,
                                               rl_instance_t *loss, rl_result_t **out_result);

/* [control-thread] (since 0.1) Forward only, no gradient. Tensors "logprobs" and "entropy"
 * (float32 [n_tokens]; 0 at each sequence's first token; at the temperature of
 * scalar "logprob_temperature", see rl_batch_t), and "values" (same layout)
 * when the model has a value head (and the loss, if any, reads values); with a
 * loss (may be NULL) also its scalars and metrics as in forward_backward.
 * (API 0.10) A reward model (rl_model_info "task" "sequence_classification";
 * loss must be NULL): tensor "scores" (float32 [n_seqs, num_labels], the
 * score head at each sequence's last token that is not the pad token, as
 * transformers pools) and scalar "num_labels" instead. */
RL_API rl_status_t rl_trainer_forward(rl_trainer_t *trainer, const rl_batch_t *batch,
                                      rl_instance_t *loss, rl_result_t **out_result);

/* [control-thread] (since 0.1) Clip the accumulated gradients by global norm, take one
 * AdamW step at the scheduled learning rate, zero the gradients, and bump the
 * model's policy version. params_json (may be NULL) overrides AdamW settings
 * for this step ("learning_rate", "beta1", "beta2", "eps", "weight_decay",
 * "gradient_clip"). Scalars "grad_norm" (before clipping), "learning_rate",
 * "step", "policy_version". */
RL_API rl_status_t rl_trainer_optim_step(rl_trainer_t *trainer, const char *params_json,
                                         rl_result_t **out_result);

/* [control-thread] (since 0.1) Checkpoint into dir/step_<N>/: model (HF safetensors),
 * optimizer state, step, RNG states and `state_json` (the caller's data
 * position; JSON object, may be NULL). Written to a temporary folder, fsynced,
 * renamed; a run killed at any moment leaves every earlier checkpoint intact.
 * Text "path". */
RL_API rl_status_t rl_trainer_save_checkpoint(rl_trainer_t *trainer, const char *dir,
                                              const char *state_json, rl_result_t **out_result);
/* [control-thread] (since 0.1) Restore the newest complete checkpoint under dir (model,
 * optimizer, step, RNG). RL_ERR_NOT_FOUND when there is none. Text "state" (the
 * saved state_json), scalar "step", text "path". */
RL_API rl_status_t rl_trainer_load_checkpoint(rl_trainer_t *trainer, const char *dir,
                                              rl_result_t **out_result);

/* ---- LoRA adapters (API 0.5; docs/lora.md) ---------------------------------------
 * Adapters sit over a model's frozen weights, several at once, each by a name
 * unique within the model. A trainer trains one adapter when its config names
 * it (rl_trainer_create: "adapter": name, or "lora": {config} to create it);
 * an engine samples with one when rl_engine_generate's params (or the
 * engine's config) give "adapter": name. Files follow PEFT's layout
 * (adapter_config.json + adapter_model.safetensors). */

/* [control-thread] (since 0.5) Create adapter `name` over `model`, initialised as PEFT
 * does (A Kaiming-uniform, B zero: the model's outputs are unchanged).
 * lora_json (may be NULL: defaults): {"rank": 8, "alpha": 16, "dropout": 0,
 * "target_modules": "all-linear" | ["q_proj", "k_proj", "v_proj", "o_proj",
 * "gate_proj", "up_proj", "down_proj"], "use_rslora": false, "seed": 0,
 * "base_model_name_or_path": the model's folder}; PEFT's spellings "r",
 * "lora_alpha", "lora_dropout" are accepted. RL_ERR_INVALID_ARG when the name
 * is taken or a key is bad (the message names it). */
RL_API rl_status_t rl_adapter_create(rl_model_t *model, const char *name, const char *lora_json);
/* [control-thread] (since 0.5) Load a PEFT LoRA folder as adapter `name` (replacing an
 * adapter of that name: trainers over the old one keep training the old one). */
RL_API rl_status_t rl_adapter_load(rl_model_t *model, const char *name, const char *dir);
/* [control-thread] (since 0.5) Save adapter `name` as a PEFT LoRA folder at `dir`, atomically. */
RL_API rl_status_t rl_adapter_save(rl_model_t *model, const char *name, const char *dir);
/* [control-thread] (since 0.5) Save the model with adapter `name` merged into its weights
 * (W + scale * B A) as an HF folder at `dir` (loads with rl_model_load; the
 * model itself is unchanged). */
RL_API rl_status_t rl_adapter_export_merged(rl_model_t *model, const char *name, const char *dir);
/* [control-thread] (since 0.5) Drop adapter `name` from the model (RL_ERR_NOT_FOUND when
 * there is none). Trainers over it keep it alive until destroyed. */
RL_API rl_status_t rl_adapter_remove(rl_model_t *model, const char *name);
/* [thread-safe] (since 0.5) name non-NULL: text "info" = JSON {"name", "rank", "alpha",
 * "dropout", "use_rslora", "target_modules", "scale", "num_parameters",
 * "version", "base_model_name_or_path"}; RL_ERR_NOT_FOUND when unknown.
 * name NULL: text "adapters" = JSON array of the adapters' names. */
RL_API rl_status_t rl_adapter_info(rl_model_t *model, const char *name, rl_result_t **out_result);

/* ---- rollout engine ------------------------------------------------------------ */

/* [control-thread] (since 0.1) A co-located engine: it reads the model's parameters in
 * place (no copy); config_json (may be NULL): {"max_batch_sequences": 0 (no
 * limit)}. [kept until rl_engine_destroy: model] */
RL_API rl_status_t rl_engine_create(rl_model_t *model, const char *config_json,
                                    rl_engine_t **out_engine);
/* [control-thread] (since 0.1) NULL is a no-op. */
RL_API void rl_engine_destroy(rl_engine_t *engine);

/* [control-thread] (since 0.1) Generate `n` samples for each prompt. prompt_ids: int64,
 * prompts back to back; prompt_cu_seqlens: int64 [n_prompts + 1]. params_json:
 * {"n", "temperature", "top_p", "top_k", "seed", "max_tokens", "stop": [str],
 * "stop_token_ids": [int], "adapter": str (API 0.5: a LoRA adapter of the
 * model; default the engine config's "adapter", else none)} (defaults: 1,
 * 1.0, 1.0, 0, 0, 32, [], the model's EOS). Samples are prompt-major
 * (prompt 0's n samples first). Result: tensors "token_ids" (int64,
 * completions back to back), "logprobs" (float32, log-prob of each sampled
 * token under the distribution it was sampled from), "cu_seqlens" (int64
 * [n_samples + 1]), "prompt_index" (int64 [n_samples]); text "completions"
 * (JSON array of decoded strings) and "finish_reasons" (JSON array of "stop"
 * | "length"); scalar "policy_version". */
RL_API rl_status_t rl_engine_generate(rl_engine_t *engine, const rl_tensor_view_t *prompt_ids,
                                      const rl_tensor_view_t *prompt_cu_seqlens,
                                      const char *params_json, rl_result_t **out_result);

/* [control-thread] (since 0.1) Weight sync after the trainer changed the parameters: adopt
 * the model's current policy version and drop cached state. Scalar
 * "policy_version". */
RL_API rl_status_t rl_engine_sync_weights(rl_engine_t *engine, rl_result_t **out_result);

/* [control-thread] (since 0.1) Release the engine's KV-cache memory / allocate it again. */
RL_API rl_status_t rl_engine_sleep(rl_engine_t *engine);
RL_API rl_status_t rl_engine_wake_up(rl_engine_t *engine);

/* ---- weight sync over a transport (docs/transports.md) --------------------------- */

/* [control-thread] (since 0.4) The trainer side of a weight sync: send the
 * model's weights as policy `version` through a transport instance (one
 * message: header {"kind": "rl.weights", "version", "step"}, every parameter
 * as a tensor with its checksum). Under trainer.parallel fsdp every rank calls
 * it (the weights are gathered); ranks that do not send pass transport NULL.
 * A send that times out or fails on I/O is retried. options_json (may be
 * NULL): {"retries": 2, "dtype": "native" | "float32" | "bfloat16"}. Result
 * (may be NULL): metrics "sync/bytes", "sync/seconds", "sync/version",
 * "sync/attempts". */
RL_API rl_status_t rl_weights_send(rl_model_t *model, rl_instance_t *transport, int64_t version,
                                   const char *options_json, rl_result_t **out_result);

/* [control-thread] (since 0.4) The inference side: wait up to timeout_ms
 * (negative: no limit) for a weight set newer than the one in use, check it
 * (checksums, names, shapes, count) and swap it into `model` at once: the
 * model is never half-updated, and any failure leaves the previous version in
 * use. Malformed or corrupted messages are refused and waited past up to
 * options {"retries": 2} times; versions not newer are skipped (option
 * "newer_than": V (API 0.5) takes any version > V instead, e.g. the older
 * version a trainer restarted from its checkpoint broadcasts). The model
 * adopts the version: call rl_engine_sync_weights on its engines next.
 * RL_ERR_TIMEOUT when none came. Result: scalar "version"; metrics
 * "sync/bytes", "sync/seconds", "sync/version", "sync/refused", "sync/stale". */
RL_API rl_status_t rl_weights_recv(rl_model_t *model, rl_instance_t *transport, int64_t timeout_ms,
                                   const char *options_json, rl_result_t **out_result);

/* ---- rollout buffer ---------------------------------------------------------------
 * Between scoring and training (DESIGN.md, step 7): scored rollouts go in,
 * complete groups that carry learning signal come out. A group completes when
 * `group_size` rollouts with its id arrived (or on rl_buffer_close_group); it
 * is then dropped when it has too few rollouts ("too_small"), its mean reward
 * is >= easy_threshold ("too_easy") or <= hard_threshold ("too_hard"), or all
 * its rewards are equal ("zero_variance"). Rollouts more than
 * max_off_policy_steps policy versions behind are dropped ("stale") at push
 * and whenever the version moves. Every call is thread-safe. */

typedef struct rl_buffer rl_buffer_t;

/* [control-thread] (since 0.1) config_json (may be NULL): {"group_size": 0 (groups close
 * only through rl_buffer_close_group), "easy_threshold": null, "hard_threshold":
 * null (null: no such rule), "drop_zero_variance": true, "reward_tolerance": 0,
 * "min_group_size": 1, "max_off_policy_steps": 8 (null: never stale),
 * "drop_log_capacity": 1024}. */
RL_API rl_status_t rl_buffer_create(const char *config_json, rl_buffer_t **out_buffer);
/* [control-thread] (since 0.1) NULL is a no-op. */
RL_API void rl_buffer_destroy(rl_buffer_t *buffer);

/* [thread-safe] (since 0.1) The trainer's current policy version (never decreases). */
RL_API rl_status_t rl_buffer_set_policy_version(rl_buffer_t *buffer, int64_t version);

/* [thread-safe] (since 0.1) Add one scored rollout. rollout_json: {"group_id": int,
 * "reward": number, "policy_version": int (default 0), "task": str,
 * "completion": str, "sampling_temperature": number >= 0 (0: greedy; the
 * rollouts of one batch must agree; default: none)}. tensors (copied): "token_ids" (int64 [n],
 * prompt + completion, required), "logprobs" (float [n], sampling logprobs), "loss_mask" ([n] of
 * 0/1; default all ones), since 0.12 "routed_experts" (integer [n, L_moe, K]: routing
 * replay's expert ids, -1: route yourself) and "routed_expert_weights" (float [n, L_moe, K]:
 * their mixing weights; needs routed_experts), any other name: a float [n] tensor carried to the
 * batch ("advantages", "ref_logprobs", ...). */
RL_API rl_status_t rl_buffer_push(rl_buffer_t *buffer, const char *rollout_json,
                                  const rl_tensor_list_t *tensors);

/* [thread-safe] (since 0.1) Complete group `group_id` with the rollouts that arrived (some
 * samples failed). *out_found (may be NULL): 0 when no such group is pending. */
RL_API rl_status_t rl_buffer_close_group(rl_buffer_t *buffer, int64_t group_id,
                                         uint32_t *out_found);

/* [thread-safe] (since 0.1) Take the oldest ready groups until they hold >= min_rollouts
 * rollouts, waiting up to timeout_ms (0: do not wait). Nothing is taken when
 * fewer are ready (scalar "rollouts" 0, no tensors). Result, sequences
 * group-major: tensors "input_ids" (int64), "cu_seqlens" (int64 [n_seqs + 1]),
 * "loss_mask" (float32), "rollout_logprobs" (float32, when pushed), the extra
 * per-token tensors (float32), "rewards" (float64 [n_seqs]), "group_ids" and
 * "policy_versions" (int64 [n_seqs]); scalars "groups", "rollouts", "tokens",
 * "sampling_temperature" (when the rollouts carry one);
 * texts "tasks" and "completions" (JSON arrays of strings). */
RL_API rl_status_t rl_buffer_pop_batch(rl_buffer_t *buffer, uint64_t min_rollouts,
                                       uint64_t timeout_ms, rl_result_t **out_result);

/* [thread-safe] (since 0.1) Counters since creation, or since the previous call with
 * take != 0 (which also drains the drop log into text "drop_log": JSON array of
 * {group_id, reason, rollouts, mean_reward, policy_version, current_version}).
 * Scalars "pushed_rollouts", "completed_groups", "passed_groups",
 * "popped_groups", "popped_rollouts", "dropped_groups", "dropped_rollouts",
 * "dropped.<reason>.groups" / ".rollouts" for every reason (stale, too_small,
 * too_easy, too_hard, zero_variance); current holdings "ready_groups",
 * "ready_rollouts", "pending_groups", "pending_rollouts", "policy_version". */
RL_API rl_status_t rl_buffer_stats(rl_buffer_t *buffer, uint32_t take, rl_result_t **out_result);

/* [thread-safe] (since 0.7) Since 0.7. Writes everything the buffer holds and has counted
 * (policy version, pending and ready groups with every field of their
 * rollouts, the counters, the drop log) to `path`, atomically: a reader sees
 * the previous file or the whole new one. A process that restarts reads it
 * back with rl_buffer_load and loses nothing it had taken in. */
RL_API rl_status_t rl_buffer_save(rl_buffer_t *buffer, const char *path);

/* [thread-safe] (since 0.7) Since 0.7. Restores a file written by rl_buffer_save into a
 * buffer that took nothing yet (RL_ERR_INVALID_ARG otherwise); the buffer keeps
 * its own config. A malformed file is refused naming it and the field, and the
 * buffer is unchanged. */
RL_API rl_status_t rl_buffer_load(rl_buffer_t *buffer, const char *path);

RL_EXTERN_C_END

#endif /* RL_TRAIN_H */
