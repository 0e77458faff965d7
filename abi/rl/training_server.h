/* abi/rl/training_server.h (API 0.5): the training server for embedders:
 * the trainer and engine behind the Tinker training API
 * (docs/training-server.md). Same conventions as runtime.h: status returns,
 * rl_last_error() on failure, opaque handles, JSON options. */
#ifndef RL_TRAINING_SERVER_H
#define RL_TRAINING_SERVER_H

#include <stdint.h>
#include "macros.h"
#include "runtime.h"
#include "status.h"
#include "train.h"

RL_EXTERN_C_BEGIN

typedef struct rl_training_server rl_training_server_t;

/* [control-thread] (since 0.5) Start a training server over `model` (the base every
 * session starts from; it must outlive the server and is never modified).
 * `runtime` (may be NULL; it too must outlive the server, which creates loss
 * instances of it while it runs) provides the loss plugins by name; Tinker's loss
 * names (cross_entropy, importance_sampling, ppo, cispo) run the plugins that
 * implement them (docs/training-server.md), so without a runtime every
 * forward_backward is refused naming the loss. options_json (may be NULL) is
 * a JSON object, every key optional but checkpoint_dir: {"host":
 * "127.0.0.1", "port": 8000 (0: any free port), "api_key": "" (set:
 * "X-API-Key: <key>" or "Authorization: Bearer <key>" needed), "model_path",
 * "base_model" (the folder's name),
 * "checkpoint_dir", "max_body_bytes": 67108864, "max_connections": 256,
 * "idle_timeout_s": 60, "session_timeout_s": 300, "poll_timeout_s": 20,
 * "future_ttl_s": 3600, "max_queued": 256, "workers": 2, "max_models": 16,
 * "max_sample_tokens": 4096, "seq_gap_wait_s": 2, "kv_cache_fraction": 0.1,
 * "trainer": {TrainerConfig keys}}. Unknown keys and wrong types are refused
 * naming the key; a port that cannot be bound is RL_ERR_IO naming host:port.
 * [kept until rl_training_server_destroy: runtime, model] */
RL_API rl_status_t rl_training_server_start(rl_runtime_t *runtime, rl_model_t *model,
                                            const char *options_json,
                                            rl_training_server_t **out_server);

/* [thread-safe] (since 0.5) The bound TCP port. */
RL_API int32_t rl_training_server_port(const rl_training_server_t *server);

/* [thread-safe] (since 0.5) Block until the server has stopped. */
RL_API rl_status_t rl_training_server_wait(rl_training_server_t *server);

/* [thread-safe] (since 0.5) Stop accepting, fail queued calls, finish running ones, close
 * connections. Idempotent. */
RL_API rl_status_t rl_training_server_stop(rl_training_server_t *server);

/* [control-thread] (since 0.5) Stop (if needed) and free. NULL is a no-op. */
RL_API void rl_training_server_destroy(rl_training_server_t *server);

RL_EXTERN_C_END

#endif /* RL_TRAINING_SERVER_H */
