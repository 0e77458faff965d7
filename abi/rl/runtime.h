/* abi/rl/runtime.h: the embedder API exported by librl. C, Lua (scripting/) and
 * Python (sdk/python) drive the runtime through these functions only.
 *
 * Conventions: every function returns rl_status_t (RL_OK on success) and, on
 * failure, leaves a message in rl_last_error() and its outputs untouched.
 * Handles are opaque; destroy functions accept NULL. Parameters and configs are
 * JSON (or YAML, where said) text; results are rl_result_t objects holding
 * scalars, texts, metrics and tensors. Pointers are borrowed for the call and
 * new handles are the caller's, released by their destroy function, unless an
 * ownership tag says otherwise (rl_api.h lists them). */
#ifndef RL_RUNTIME_H
#define RL_RUNTIME_H

#include <stdint.h>
#include "host.h"
#include "kinds/advantage.h"
#include "kinds/env.h"
#include "kinds/filter.h"
#include "kinds/loss.h"
#include "macros.h"
#include "status.h"
#include "tensor.h"
#include "types.h"

RL_EXTERN_C_BEGIN

typedef struct rl_runtime rl_runtime_t;   /* the host: plugins, registry, logging */
typedef struct rl_instance rl_instance_t; /* one configured plugin instance */
typedef struct rl_result rl_result_t;     /* outputs of one call */

enum {
    /* Do not scan RL_PLUGIN_PATH and the build's and install's plugin folders. */
    RL_RUNTIME_NO_DEFAULT_PLUGINS = 1u << 0
};

/* Arguments of rl_runtime_create(). [borrowed: next_in_chain, plugin_path, log_level] */
typedef struct rl_runtime_desc {
    uint32_t struct_size;
    uint32_t flags;                  /* RL_RUNTIME_* */
    const rl_chain_t *next_in_chain; /* optional extension structs */
    const char *plugin_path;         /* extra plugin files or folders, ':'-separated; may be NULL */
    const char *log_level;           /* "trace".."error", "off"; NULL means "info" */
} rl_runtime_desc_t;
#define RL_RUNTIME_DESC_INIT                                                                       \
    { sizeof(rl_runtime_desc_t), 0, NULL, NULL, NULL }

/* [thread-safe] (since 0.1) Static name of a status ("RL_ERR_INVALID_ARG"); never NULL, never
 * freed. Unknown values give "RL_ERR_<unlisted>". Plugins have the same
 * through their SDK (rl/sdk/error.hpp). [static] */
RL_API const char *rl_status_name(rl_status_t status);

/* [thread-safe] (since 0.1) Message of the most recent failing rl_* call of librl on the
 * calling thread. Never NULL ("" when nothing failed).
 * [owned by librl until the next failing call on this thread] */
RL_API const char *rl_last_error(void);

/* [thread-safe] (since 0.1) RL_PLUGIN_ABI_VERSION librl was built with: the plugin ABI its
 * loader accepts (RL_ABI_COMPATIBLE). */
RL_API uint32_t rl_get_abi_version(void);
/* [thread-safe] (since 0.11) RL_API_VERSION librl was built with: the embedder API it
 * implements (every function of rl_api.h marked "since" up to this version). */
RL_API uint32_t rl_get_api_version(void);
/* [thread-safe] (since 0.1) librl's version string ("0.1.0"). [static] */
RL_API const char *rl_get_version(void);

/* [control-thread] (since 0.1) Create a runtime: plugins are loaded from desc->plugin_path,
 * then (unless RL_RUNTIME_NO_DEFAULT_PLUGINS) RL_PLUGIN_PATH and the build's and
 * install's plugin folders. A library that fails to load is recorded as refused
 * (see rl_runtime_list_plugins) and never stops the runtime. desc may be NULL. */
RL_API rl_status_t rl_runtime_create(const rl_runtime_desc_t *desc, rl_runtime_t **out_runtime);
/* [control-thread] (since 0.1) Destroy instances, unload libraries. NULL is a no-op. */
RL_API void rl_runtime_destroy(rl_runtime_t *runtime);

/* [control-thread] (since 0.1) Load one plugin library (a file) or every library in a folder.
 * Fails (with the reason in rl_last_error) when the only library named cannot
 * be loaded; the refusal is also recorded. */
RL_API rl_status_t rl_runtime_load_plugin(rl_runtime_t *runtime, const char *path);

/* [control-thread] (since 0.1) Text "plugins": JSON {"plugins": [{kind, name, id, version,
 * abi_version, path, description, features}], "refused": [{path, reason}]}. */
RL_API rl_status_t rl_runtime_list_plugins(rl_runtime_t *runtime, rl_result_t **out_result);

/* [control-thread] (since 0.1) Create an instance of plugin `name` of `kind` with
 * parameters `params_json` (a JSON object; NULL means "{}"). rl_runtime_destroy
 * destroys the instances still alive: destroy none of them again.
 * [owned by caller until rl_instance_destroy or rl_runtime_destroy: out_instance] */
RL_API rl_status_t rl_instance_create(rl_runtime_t *runtime, const char *kind, const char *name,
                                      const char *params_json, rl_instance_t **out_instance);
/* [control-thread] (since 0.1) NULL is a no-op. */
RL_API void rl_instance_destroy(rl_instance_t *instance);

/* [control-thread] (since 0.2) Text "params": the instance's effective parameters
 * as a JSON object; scalar "from_plugin": 1 when they come from the plugin's
 * get_params(), 0 when the plugin has none (a 0.1 plugin) and they are the
 * parameters the host passed to create(). An env instance adds scalar
 * "multi_turn" (API 0.9): 1 when it has a step() (kinds/env.h). */
RL_API rl_status_t rl_instance_params(rl_instance_t *instance, rl_result_t **out_result);

/* [worker] (since 0.1) Evaluate a loss. want_grads != 0 asks for gradients: result tensors
 * "grad.<input>" for each differentiable input present. Result scalar "loss",
 * metrics, and the plugin's extra tensors. */
RL_API rl_status_t rl_loss_compute(rl_instance_t *instance, const rl_loss_inputs_t *inputs,
                                   uint32_t want_grads, rl_result_t **out_result);
/* [thread-safe] (since 0.1) Text "signature": JSON {"required": [...], "optional": [...],
 * "differentiable": [...]}. */
RL_API rl_status_t rl_loss_signature(rl_instance_t *instance, rl_result_t **out_result);

/* [worker] (since 0.1) Tensors "advantages" (and "returns"), metrics. */
RL_API rl_status_t rl_advantage_compute(rl_instance_t *instance,
                                        const rl_advantage_inputs_t *inputs,
                                        rl_result_t **out_result);

/* [worker] (since 0.1) Scalars "flagged" (0/1) and "enforce" (0/1), text "reason", metrics. */
RL_API rl_status_t rl_filter_check(rl_instance_t *instance, const rl_rollout_view_t *rollout,
                                   rl_result_t **out_result);

/* [worker] (since 0.1) Text "tasks" (JSON array). */
RL_API rl_status_t rl_env_sample(rl_instance_t *instance, uint64_t n, uint64_t seed,
                                 rl_result_t **out_result);
/* [worker] (since 0.1) Scalar "reward", metrics. */
RL_API rl_status_t rl_env_score(rl_instance_t *instance, rl_string_view_t task,
                                rl_string_view_t completion, rl_result_t **out_result);
/* [worker] (since 0.9) One step of a multi-turn episode (kinds/env.h): the env
 * answers the assistant turn `completion` of `task` given `state` ("null" on
 * the first turn). Scalars "done" (0/1) and "reward" (this turn's; 0 when the
 * env gives none); texts "observation" (the env's answer: the next user turn
 * or tool results; empty when done), "role" ("user" or "tool": how a chat
 * template renders the observation) and "state" (JSON text to pass to the
 * next step); metrics. RL_ERR_UNSUPPORTED for a single-turn env; a malformed
 * step result is an error naming the env. */
RL_API rl_status_t rl_env_step(rl_instance_t *instance, rl_string_view_t task,
                               rl_string_view_t state, rl_string_view_t completion,
                               rl_result_t **out_result);

/* [worker] (since 0.4) Send one message through a transport instance: a JSON
 * object header (empty: {}) and named, contiguous CPU tensors; everything is
 * borrowed for the call. docs/transports.md. */
RL_API rl_status_t rl_transport_send(rl_instance_t *instance, rl_string_view_t header,
                                     const rl_tensor_list_t *tensors);
/* [worker] (since 0.4) Receive one message: text "header" (the sender's JSON
 * object), its tensors by name, metrics. Waits at most timeout_ms (negative:
 * no limit, 0: poll); RL_ERR_TIMEOUT when nothing arrived. A malformed message
 * or a checksum mismatch is an error naming it, and nothing is returned. */
RL_API rl_status_t rl_transport_recv(rl_instance_t *instance, int64_t timeout_ms,
                                     rl_result_t **out_result);

/* [thread-safe] (since 0.1) Load a run configuration: the YAML file at `path` (NULL or "" for
 * defaults only), then `n_overrides` "dotted.key=value" overrides (value in
 * YAML syntax), checked against the configuration schema (docs/configuration.md).
 * Text "config": the complete configuration as JSON, defaults filled in. Errors
 * name the file, the key and the line (or the override). Top-level sections the
 * schema does not know are kept as written and listed in text "undeclared" (a
 * JSON array): they belong to the script, which checks them with
 * rl_config_declare(). */
RL_API rl_status_t rl_config_load(const char *path, const char *const *overrides,
                                  uint64_t n_overrides, rl_result_t **out_result);

/* [thread-safe] (since 0.1) Check a script's own configuration sections. `config_json` is
 * the text "config" of rl_config_load(); `declarations_json` a JSON array of
 * {"key": "ppo.epochs", "type": "string" | "integer" | "number" | "boolean" |
 * "strings" | "mapping" | "mappings", "default", "doc", and optionally
 * "choices", "min", "max", "min_open", "max_open", "nullable"}. Text "config":
 * the configuration with the declared keys checked and their defaults filled.
 * A top-level name that neither the schema nor a declaration knows, and a key
 * under a declared section that no declaration covers, are errors naming it. */
RL_API rl_status_t rl_config_declare(const char *config_json, const char *declarations_json,
                                     rl_result_t **out_result);

/* [thread-safe] (since 0.1) Text "schema": JSON array of every configuration key, each
 * {"key", "type", "default", "doc"} plus "choices", "min", "max", "min_open",
 * "max_open", "nullable" where they apply (the declaration format of
 * rl_config_declare()). Text "markdown": the tables of docs/configuration.md. */
RL_API rl_status_t rl_config_schema(rl_result_t **out_result);

/* ---- results ---------------------------------------------------------------
 * A result owns everything it holds; views and texts taken from it are borrowed
 * and valid until rl_result_destroy(). */

/* [thread-safe] (since 0.1) Frees the result and everything borrowed from it;
 * no call may be reading it. NULL is a no-op. */
RL_API void rl_result_destroy(rl_result_t *result);
/* [thread-safe] (since 0.1) The whole result as one JSON object {"scalars": {},
 * "metrics": {}, "texts": {}, "tensors": {name: {"dtype", "shape"}}}; the text
 * is borrowed from the result. Readers of one result may run concurrently.
 * [owned by librl until rl_result_destroy: out_json] */
RL_API rl_status_t rl_result_json(const rl_result_t *result, rl_string_view_t *out_json);
/* [thread-safe] (since 0.1) One named value; RL_ERR_NOT_FOUND when absent. */
RL_API rl_status_t rl_result_scalar(const rl_result_t *result, const char *name, double *out);
RL_API rl_status_t rl_result_metric(const rl_result_t *result, const char *name, double *out);
/* [thread-safe] (since 0.1) One named text, borrowed from the result; RL_ERR_NOT_FOUND
 * when absent. [owned by librl until rl_result_destroy: out] */
RL_API rl_status_t rl_result_text(const rl_result_t *result, const char *name,
                                  rl_string_view_t *out);
/* [thread-safe] (since 0.1) A CPU, contiguous view borrowed from the result;
 * RL_ERR_NOT_FOUND when absent. [owned by librl until rl_result_destroy: out] */
RL_API rl_status_t rl_result_tensor(const rl_result_t *result, const char *name,
                                    rl_tensor_view_t *out);

RL_EXTERN_C_END

#endif /* RL_RUNTIME_H */
