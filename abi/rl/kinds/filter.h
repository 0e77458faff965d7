/* abi/rl/kinds/filter.h: the rollout-filter contract.
 *
 * One rollout in, a verdict out. Whether a flagged rollout is masked from the
 * loss (`enforce: true`) or only reported is the host's decision: the host
 * reads and strips the `enforce` parameter before create(). */
#ifndef RL_KINDS_FILTER_H
#define RL_KINDS_FILTER_H

#include <stdint.h>
#include "../host.h"
#include "../macros.h"
#include "../plugin.h"
#include "../status.h"
#include "../tensor.h"

RL_EXTERN_C_BEGIN

#define RL_IFACE_FILTER "rl.filter/1"
#define RL_FILTER_REASON_SIZE 64

typedef struct rl_rollout_view {
    uint32_t struct_size;
    uint32_t reserved0;         /* 0 */
    rl_tensor_view_t token_ids; /* int64 [n]: the completion's tokens */
    rl_tensor_view_t logprobs;  /* float32/64 [n]: log-probability of each sampled token */
    int64_t vocab_size;         /* size of the sampling distribution */
} rl_rollout_view_t;

typedef struct rl_filter_verdict {
    uint32_t struct_size;
    uint32_t flagged;                   /* 1 when the rollout trips the filter */
    char reason[RL_FILTER_REASON_SIZE]; /* NUL-terminated short tag; "" when not flagged */
} rl_filter_verdict_t;

typedef struct rl_filter_iface {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */

    /* [worker] Judge one rollout; fill *out (the host set out->struct_size and
     * zeroed the rest). Metrics through emit_metric. */
    rl_status_t(RL_ABI *check)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                               const rl_rollout_view_t *rollout, rl_filter_verdict_t *out);
} rl_filter_iface_t;

RL_EXTERN_C_END

#endif /* RL_KINDS_FILTER_H */
