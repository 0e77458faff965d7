/* abi/rl/serve.h: the inference server (`rlhost serve`) for embedders: a
 * model's rollout engine behind OpenAI-compatible and SGLang-native HTTP
 * routes (docs/serving.md). Same conventions as runtime.h: status returns,
 * rl_last_error() on failure, opaque handles, JSON options. */
#ifndef RL_SERVE_H
#define RL_SERVE_H

#include <stdint.h>
#include "macros.h"
#include "status.h"
#include "train.h"

RL_EXTERN_C_BEGIN

typedef struct rl_server rl_server_t; /* an HTTP server over one model */

/* [control-thread] (since 0.4) Start serving `model` (it must outlive the server; a
 * tokenizer-only handle is refused): binds, listens and returns once requests
 * are accepted. options_json (may be NULL) is a JSON object, every key
 * optional: {"host": "127.0.0.1", "port": 30000 (0: any free port, see
 * rl_server_port), "api_key": "" (set: requests need "Authorization: Bearer
 * <key>"), "served_model_name": the model folder's name, "model_path",
 * "max_tokens_limit": 4096, "max_body_bytes": 8388608, "max_connections": 256,
 * "request_timeout_s": 600, "idle_timeout_s": 60, "max_running": 32,
 * "max_queued": 256, "max_context": 0 (the model's, capped at 4096),
 * "kv_cache_fraction": 0.3, "reasoning_parser": "" ("qwen3": chat replies
 * give the text of a <think> block as reasoning_content)}. Unknown keys and
 * wrong types are refused naming the key; a port that cannot be bound is
 * RL_ERR_IO naming host:port. [kept until rl_server_destroy: model] */
RL_API rl_status_t rl_server_start(rl_model_t *model, const char *options_json,
                                   rl_server_t **out_server);

/* [thread-safe] (since 0.4) The bound TCP port. */
RL_API int32_t rl_server_port(const rl_server_t *server);

/* [thread-safe] (since 0.4) Block until the server has stopped (rl_server_stop from
 * another thread, e.g. one that waits for SIGINT / SIGTERM with sigwait). */
RL_API rl_status_t rl_server_wait(rl_server_t *server);

/* [thread-safe] (since 0.4) Stop accepting, cancel requests in flight, close connections.
 * Idempotent; returns once the server has stopped. */
RL_API rl_status_t rl_server_stop(rl_server_t *server);

/* [control-thread] (since 0.4) Stop (if needed) and free. NULL is a no-op. */
RL_API void rl_server_destroy(rl_server_t *server);

RL_EXTERN_C_END

#endif /* RL_SERVE_H */
