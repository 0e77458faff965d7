/* abi/rl_api.h: the C ABI of the RL runtime (its version: RL_ABI_VERSION in rl/version.h).
 *
 * Pure C11 with no dependency beyond stdint.h, stddef.h and stdbool.h. Plugins
 * include it (usually through sdk/); embedders include it and link librl.
 * Read docs/abi.md for the rules: versioning, ownership, errors, threading.
 *
 * Thread annotations on members:
 *   [control-thread]  the thread that created the runtime (Lua runs there)
 *   [worker]          any host thread, one call at a time per instance
 *   [call-thread]     the thread of the call the context belongs to
 *   [thread-safe]     any thread, concurrently */
#ifndef RL_API_H
#define RL_API_H

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
#include "rl/runtime.h"
#include "rl/train.h"
#include "rl/step.h"
#include "rl/dist.h"
#include "rl/inference.h"
#include "rl/serve.h"
#include "rl/training_server.h"

#endif /* RL_API_H */
