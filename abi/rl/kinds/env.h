/* abi/rl/kinds/env.h: the environment contract.
 *
 * A task is a JSON object {"prompt": str, "answer": str or null, "metadata":
 * object}; text is UTF-8. An env samples tasks deterministically from a seed
 * and scores a completion of a task with a reward (each env documents its
 * range) and metrics. Multi-turn envs add step(). */
#ifndef RL_KINDS_ENV_H
#define RL_KINDS_ENV_H

#include <stdint.h>
#include "../host.h"
#include "../macros.h"
#include "../plugin.h"
#include "../status.h"
#include "../types.h"

RL_EXTERN_C_BEGIN

#define RL_IFACE_ENV "rl.env/1"

typedef struct rl_env_iface {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */

    /* [worker] Emit text "tasks": a JSON array of `n` tasks. The same (n, seed)
     * gives the same tasks. */
    rl_status_t(RL_ABI *sample)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx, uint64_t n,
                                uint64_t seed);

    /* [worker] Score `completion` for `task` (one element of a "tasks" array,
     * JSON text). Writes the reward to *out_reward; metrics through emit_metric.
     * A completion that cannot be parsed is a low reward, not an error; an error
     * means the env could not judge (a verifier that died or timed out). */
    rl_status_t(RL_ABI *score)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                               rl_string_view_t task, rl_string_view_t completion,
                               double *out_reward);

    /* [worker] Optional (NULL for single-turn envs). Advance a multi-turn
     * episode after the assistant turn `completion`: emit text "state", a JSON
     * object {"done": bool, "reward": number (this turn's; optional, 0),
     * "observation": str (the answer when not done: the next user turn or the
     * results of the turn's tool calls; "prompt" is accepted as its older
     * name), "role": "user" | "tool" (optional, "user": how a chat template
     * renders the observation), "state": any (what the env needs next time)}.
     * `state` is "null" on the first turn, else the "state" member of the last
     * result. The episode's first observation is the task's "prompt". A
     * malformed assistant turn (a tool call that does not parse) is an
     * observation telling the model so, not an error; an error drops the
     * episode (a tool process that died). */
    rl_status_t(RL_ABI *step)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                              rl_string_view_t task, rl_string_view_t state,
                              rl_string_view_t completion);
} rl_env_iface_t;

RL_EXTERN_C_END

#endif /* RL_KINDS_ENV_H */
