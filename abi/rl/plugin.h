/* abi/rl/plugin.h: descriptors, the factory and the plugin instance. */
#ifndef RL_PLUGIN_H
#define RL_PLUGIN_H

#include <stdint.h>
#include "host.h"
#include "macros.h"
#include "status.h"
#include "types.h"

RL_EXTERN_C_BEGIN

#define RL_FACTORY_PLUGIN "rl.factory.plugin/1"

/* Kinds are strings, so a new kind needs no enum change. */
#define RL_KIND_LOSS "loss"
#define RL_KIND_ADVANTAGE "advantage"
#define RL_KIND_FILTER "filter"
#define RL_KIND_TRANSPORT "transport"
#define RL_KIND_ENV "env"

/* What a plugin is. Owned by the library, valid until the entry's deinit().
 * [owned by library until deinit(): id, kind, name, version, description, features] */
typedef struct rl_plugin_desc {
    uint32_t struct_size;
    uint32_t abi_version;        /* RL_PLUGIN_ABI_VERSION the plugin was compiled for */
    const char *id;              /* unique, reverse-DNS: "org.rl.loss.policy_loss"; mandatory */
    const char *kind;            /* RL_KIND_*; mandatory */
    const char *name;            /* what users type: "policy_loss"; unique per kind; mandatory */
    const char *version;         /* the plugin's own version, "1.0.0"; mandatory */
    const char *description;     /* one line; may be NULL */
    const char *const *features; /* NULL-terminated ("device-tensors", ...); may be NULL */
} rl_plugin_desc_t;

/* Arguments of factory->create(). [borrowed: next_in_chain] */
typedef struct rl_plugin_create_desc {
    uint32_t struct_size;
    uint32_t reserved0;              /* 0 */
    const rl_chain_t *next_in_chain; /* optional extension structs */
    rl_string_view_t params;         /* JSON object of parameters ("{}" if none); borrowed */
} rl_plugin_create_desc_t;
#define RL_PLUGIN_CREATE_DESC_INIT                                                                 \
    {                                                                                              \
        sizeof(rl_plugin_create_desc_t), 0, NULL, {                                                \
            "{}", 2                                                                                \
        }                                                                                          \
    }

/* A plugin instance. Owned by the plugin; valid until destroy(). */
typedef struct rl_plugin {
    uint32_t struct_size;
    uint32_t reserved0;           /* 0 */
    const rl_plugin_desc_t *desc; /* [owned by library until deinit()] */
    void *plugin_data;            /* [owned by plugin until destroy()] reserved for the plugin */

    /* [control-thread] Frees the instance and everything it owns. No call on it
     * may be in flight. */
    void(RL_ABI *destroy)(const struct rl_plugin *plugin);

    /* [thread-safe] An interface by revisioned id: the kind's interface
     * (RL_IFACE_LOSS, ...) and optional ones. NULL if not provided.
     * [owned by plugin until destroy()] */
    const void *(RL_ABI *get_interface)(const struct rl_plugin *plugin, const char *id);

    /* ---- plugin ABI 0.2: read with RL_HAS_FIELD(plugin, rl_plugin_t, get_params) ---- */

    /* [control-thread] Optional (NULL, or absent from a 0.1 plugin): emit text
     * "params", the instance's effective parameters as one JSON object, defaults
     * filled in. When absent the host reports the parameters it passed to
     * create(). */
    rl_status_t(RL_ABI *get_params)(const struct rl_plugin *plugin, const rl_call_ctx_t *ctx);
} rl_plugin_t;

typedef struct rl_plugin_factory {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */

    /* [thread-safe] Number of plugins in the library. */
    uint32_t(RL_ABI *count)(const struct rl_plugin_factory *factory);

    /* [thread-safe] Descriptor `index` (0..count-1); NULL if out of range.
     * [owned by library until deinit()] */
    const rl_plugin_desc_t *(RL_ABI *get_desc)(const struct rl_plugin_factory *factory,
                                               uint32_t index);

    /* [control-thread] Create an instance of the plugin with descriptor id
     * `plugin_id`, configured by desc->params. Bad parameters are refused here
     * with RL_ERR_INVALID_ARG and a message (ctx->host->fail) that names the
     * parameter and lists the valid ones. ctx->host stays valid for the life of
     * the instance. On success *out_plugin is set; on failure it is untouched.
     * The caller frees the instance with out_plugin->destroy() (before deinit()).
     * [owned by caller until destroy(): out_plugin] */
    rl_status_t(RL_ABI *create)(const struct rl_plugin_factory *factory, const rl_call_ctx_t *ctx,
                                const char *plugin_id, const rl_plugin_create_desc_t *desc,
                                const rl_plugin_t **out_plugin);
} rl_plugin_factory_t;

RL_EXTERN_C_END

#endif /* RL_PLUGIN_H */
