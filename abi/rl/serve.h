/* abi/rl/serve.h: the inference server (`rlhost serve`) for embedders: a
 * model's rollout engine behind OpenAI-compatible and SGLang-native HTTP
 * routes (docs/serving.md). Same conventions as runtime.h: status returns,
 * rl_last_error() on failure, opaque handles, JSON options. */
#ifndef RL_SERVE_H
#define RL_SERVE_H

#include <stdint.h>
#include "macros.h"
#include "status.h"
#include "runtime.h"
#include "train.h"

RL_EXTERN_C_BEGIN

typedef struct rl_server rl_server_t; /* an HTTP server over one model */

/* [control-thread] Start serving `model` (it must outlive the server; a
 * tokenizer-only handle is refused): binds, listens and returns once requests
 * are accepted. options_json (may be NULL) is a JSON object, every key
 * optional: {"host": "127.0.0.1", "port": 30000 (0: any free port, see
 * rl_server_port), "api_key": "" (set: requests need "Authorization: Bearer
 * <key>"), "served_model_name": the model folder's name, "model_path",
 * "max_tokens_limit": 4096, "max_body_bytes": 8388608, "max_connections": 256,
 * "request_timeout_s": 600, "idle_timeout_s": 60, "max_running": 32,
 * "max_queued": 256, "max_context": 0 (the model's, capped at 4096),
 * "kv_cache_fraction": 0.3}. Unknown keys and wrong types are refused naming
 * the key; a port that cannot be bound is RL_ERR_IO naming host:port. */
RL_API rl_status_t rl_server_start(rl_model_t *model, const char *options_json,
                                   rl_server_t **out_server);

/* [thread-safe] The bound TCP port. */
RL_API int32_t rl_server_port(const rl_server_t *server);

/* [thread-safe] Block until the server has stopped (rl_server_stop from
 * another thread, e.g. one that waits for SIGINT / SIGTERM with sigwait). */
RL_API rl_status_t rl_server_wait(rl_server_t *server);

/* [thread-safe] Stop accepting, cancel requests in flight, close connections.
 * Idempotent; returns once the server has stopped. */
RL_API rl_status_t rl_server_stop(rl_server_t *server);

/* [control-thread] Stop (if needed) and free. NULL is a no-op. */
RL_API void rl_server_destroy(rl_server_t *server);

/* ---- the training server (ABI 0.5) ------------------------------------------
 * `rlhost training-server`: the trainer and engine behind the Tinker training
 * API (sessions, futures, forward_backward / optim_step / save / load /
 * sample; xorl's names as aliases), docs/training-server.md. */

typedef struct rl_training_server rl_training_server_t;

/* [control-thread] Start a training server over `model` (the base every
 * session starts from; it must outlive the server and is never modified).
 * `runtime` (may be NULL) provides loss plugins by name next to Tinker's
 * built-in losses. options_json (may be NULL) is a JSON object, every key
 * optional but checkpoint_dir: {"host": "127.0.0.1", "port": 8000 (0: any
 * free port), "api_key": "" (set: "X-API-Key: <key>" or "Authorization:
 * Bearer <key>" needed), "model_path", "base_model" (the folder's name),
 * "checkpoint_dir", "max_body_bytes": 67108864, "max_connections": 256,
 * "idle_timeout_s": 60, "session_timeout_s": 300, "poll_timeout_s": 20,
 * "future_ttl_s": 3600, "max_queued": 256, "workers": 2, "max_models": 16,
 * "max_sample_tokens": 4096, "seq_gap_wait_s": 2, "kv_cache_fraction": 0.1,
 * "trainer": {TrainerConfig keys}}. Unknown keys and wrong types are refused
 * naming the key; a port that cannot be bound is RL_ERR_IO naming host:port. */
RL_API rl_status_t rl_training_server_start(rl_runtime_t *runtime, rl_model_t *model,
                                            const char *options_json,
                                            rl_training_server_t **out_server);

/* [thread-safe] The bound TCP port. */
RL_API int32_t rl_training_server_port(const rl_training_server_t *server);

/* [thread-safe] Block until the server has stopped. */
RL_API rl_status_t rl_training_server_wait(rl_training_server_t *server);

/* [thread-safe] Stop accepting, fail queued calls, finish running ones, close
 * connections. Idempotent. */
RL_API rl_status_t rl_training_server_stop(rl_training_server_t *server);

/* [control-thread] Stop (if needed) and free. NULL is a no-op. */
RL_API void rl_training_server_destroy(rl_training_server_t *server);

RL_EXTERN_C_END

#endif /* RL_SERVE_H */
