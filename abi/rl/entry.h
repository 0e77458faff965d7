/* abi/rl/entry.h: the one symbol a plugin library exports. */
#ifndef RL_ENTRY_H
#define RL_ENTRY_H

#include <stdint.h>
#include "host.h"
#include "macros.h"
#include "status.h"

RL_EXTERN_C_BEGIN

/* The only exported symbol of a plugin library: a function (not a data symbol,
 * so static builds can rename it per plugin) returning a static table. */
#define RL_PLUGIN_ENTRY_SYMBOL "rl_plugin_entry"

typedef struct rl_plugin_entry {
    uint32_t struct_size;
    uint32_t abi_version; /* RL_PLUGIN_ABI_VERSION the library was compiled for */

    /* [control-thread] Fast and cheap: hosts call it to list plugins. No
     * threads, no device work, no large allocations. Called once per load of
     * the library, before anything else. `host` stays valid until deinit();
     * `library_path` is borrowed for the call. A library that cannot
     * work with host->abi_version returns RL_ERR_INCOMPATIBLE. Failure messages
     * go through host->log (there is no call context yet). [kept until deinit(): host] */
    rl_status_t(RL_ABI *init)(const rl_host_api_t *host, const char *library_path);

    /* [control-thread] Called once, after every instance made by this library
     * was destroyed; the host unloads the library afterwards. */
    void(RL_ABI *deinit)(void);

    /* [thread-safe] A factory by id (RL_FACTORY_PLUGIN); NULL if the library has
     * none. [owned by library until deinit()] */
    const void *(RL_ABI *get_factory)(const char *factory_id);
} rl_plugin_entry_t;

/* [control-thread] Type of the exported function, called by the loader. It returns a pointer to
 * static storage that stays valid while the library is loaded; it never fails and has no side
 * effects. [static] */
typedef const rl_plugin_entry_t *(RL_ABI *rl_plugin_entry_fn)(void);

RL_EXTERN_C_END

#endif /* RL_ENTRY_H */
