/* abi/rl_plugin.h: the plugin ABI, everything a plugin library sees (its
 * version: RL_PLUGIN_ABI_VERSION in rl/version.h, the only one the loader
 * checks).
 *
 * Pure C11 with no dependency beyond stdint.h, stddef.h and stdbool.h. A
 * plugin reaches the host only through the tables declared here and never
 * links librl; the SDK (sdk/include/rl/sdk) includes this header. Embedders
 * include rl_api.h, which adds librl's functions (the embedder API, its own
 * version: RL_API_VERSION). Read docs/abi.md for the rules.
 *
 * Thread annotations on members:
 *   [control-thread]  the thread that created the runtime (Lua runs there)
 *   [worker]          any host thread, one call at a time per instance
 *   [call-thread]     the thread of the call the context belongs to
 *   [thread-safe]     any thread, concurrently
 *
 * Ownership of every pointer (docs/ownership.md): a tag in its comment, where
 * "[tag: a, b]" covers the parameters (or the struct's fields) a and b and, in a
 * function's comment, a tag without names covers the returned pointer:
 *   [borrowed]            the giver's, valid until the call returns (a field: as
 *                         long as the struct holding it); copy what you keep
 *   [kept until E]        the giver's; the receiver goes on using it, so it stays
 *                         valid until E
 *   [owned by O until E]  O's (caller, librl, host, plugin or library), valid
 *                         until E; a caller that owns it releases it with E
 *   [static]              never freed; valid while its library is loaded
 *   [released]            freed by the call; invalid once it returns
 * Without a tag, a parameter is [borrowed], but: the first parameter of
 * destroy() and rl_*_destroy is [released], and `rl_x_t **out_*` is a new
 * handle, [owned by caller until rl_x_destroy]. An out parameter whose target
 * holds pointers, a returned pointer and a pointer field always have a tag. */
#ifndef RL_PLUGIN_H_UMBRELLA
#define RL_PLUGIN_H_UMBRELLA

#include "rl/macros.h"
#include "rl/version.h"
#include "rl/status.h"
#include "rl/types.h"
#include "rl/tensor.h"
#include "rl/host.h"
#include "rl/entry.h"
#include "rl/plugin.h"
#include "rl/kinds/loss.h"
#include "rl/kinds/advantage.h"
#include "rl/kinds/filter.h"
#include "rl/kinds/env.h"
#include "rl/kinds/transport.h"

#endif /* RL_PLUGIN_H_UMBRELLA */
