/* abi/rl_api.h: the C API of the RL runtime, both contracts: the plugin ABI
 * (rl_plugin.h, RL_PLUGIN_ABI_VERSION) and the embedder API, librl's functions
 * (RL_API_VERSION; each function says since which version it exists). Both
 * versions live in rl/version.h.
 *
 * Pure C11 with no dependency beyond stdint.h, stddef.h and stdbool.h.
 * Embedders include it and link librl; plugins include rl_plugin.h (usually
 * through sdk/). Read docs/abi.md for the rules: versioning, ownership,
 * errors, threading.
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
#ifndef RL_API_H
#define RL_API_H

#include "rl_plugin.h"

/* The embedder API: librl's functions (RL_API_VERSION). */
#include "rl/runtime.h"
#include "rl/train.h"
#include "rl/step.h"
#include "rl/dist.h"
#include "rl/inference.h"
#include "rl/serve.h"
#include "rl/training_server.h"
#include "rl/disagg.h"

#endif /* RL_API_H */
