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
 *   [thread-safe]     any thread, concurrently */
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
