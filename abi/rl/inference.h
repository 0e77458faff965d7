/* abi/rl/inference.h: the trainer side of the inference sync layer
 * (docs/serving.md). A client of an inference server that speaks SGLang's
 * HTTP protocol (`rlhost serve`, SGLang) or vLLM's (prime-rl's routes, and
 * vLLM's NCCL weight-transfer engine): JSON calls (generate, pause, ...) and
 * weight syncs with the version handshake. */
#ifndef RL_INFERENCE_H
#define RL_INFERENCE_H

#include <stdint.h>
#include "macros.h"
#include "runtime.h"
#include "status.h"
#include "step.h"
#include "train.h"

RL_EXTERN_C_BEGIN

typedef struct rl_inference_client rl_inference_client_t;

/* [control-thread] (since 0.4) `options_json`: {"url": "http://host:port" (required), "api_key":
 * string, "timeout": seconds (600), "protocol": "sglang" | "vllm"}. Connects lazily: nothing is
 * sent until the first call. */
RL_API rl_status_t rl_inference_client_create(const char *options_json,
                                              rl_inference_client_t **out_client);
/* [control-thread] (since 0.4) NULL is a no-op. */
RL_API void rl_inference_client_destroy(rl_inference_client_t *client);

/* [control-thread] (since 0.4) One HTTP call with a JSON body (`body_json` NULL: none). Result:
 * text "body" (the reply, JSON or plain text). A non-2xx reply is RL_ERR_INVALID_ARG (4xx) or
 * RL_ERR_IO with the server's message; no result. */
RL_API rl_status_t rl_inference_client_call(rl_inference_client_t *client, const char *method,
                                            const char *path, const char *body_json,
                                            rl_result_t **out_result);

/* [control-thread] (since 0.4) Brings the server to the model's weights, labelled `version` (>= 0):
 * skipped when the server already reports this version or a newer one; else pause -> update ->
 * continue, and the server must then report `version`. `options_json` (NULL: defaults): {"mode":
 * "disk" | "distributed", "dir" (disk: a folder the server can read), "keep", "master_address",
 * "master_port", "group_name", "backend", "bucket_bytes", "flattened",
 * "checksums", "dtype", "rendezvous"} as docs/serving.md lists ("vllm" +
 * "distributed": vLLM's NCCL weight-transfer engine, the model on CUDA;
 * "rendezvous": "store" or "unique_id", the id in the init request). Result: scalars "skipped"
 * (0/1), "version", "tensors"; metrics "sync/bytes", "sync/seconds",
 * "sync/version"; text "server_version". */
RL_API rl_status_t rl_inference_client_sync(rl_inference_client_t *client, rl_model_t *model,
                                            int64_t version, const char *options_json,
                                            rl_result_t **out_result);

/* [control-thread] (since 0.4) The rollouts of `tasks_json` sampled by the server, as
 * rl_rollouts_generate makes them with the engine in process (abi/rl/step.h: same tasks, same
 * options: chat_template, chat_template_kwargs, group_offset, sampling,
 * parse_special_tokens): prompts encoded with `model`'s tokenizer (a model or
 * an rl_tokenizer_load handle), one /generate call with return_logprob, each
 * rollout stamped with the oldest weight_version the server reports. */
RL_API rl_status_t rl_inference_client_rollouts(rl_inference_client_t *client, rl_model_t *model,
                                                const char *tasks_json, const char *options_json,
                                                rl_rollouts_t **out_rollouts);

RL_EXTERN_C_END

#endif /* RL_INFERENCE_H */
