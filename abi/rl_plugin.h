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
 *   [thread-safe]     any thread, concurrently */
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
