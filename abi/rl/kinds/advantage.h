/* abi/rl/kinds/advantage.h: the advantage-estimator contract.
 *
 * Sequence rewards, group ids and token offsets in; per-token advantages (and,
 * for estimators with a critic, returns) out, emitted as tensors through
 * ctx->host->emit_tensor:
 *   "advantages"  float64 [n_tokens]   mandatory
 *   "returns"     float64 [n_tokens]   when the estimator computes them
 * Tokens outside "loss_mask" get advantage 0. */
#ifndef RL_KINDS_ADVANTAGE_H
#define RL_KINDS_ADVANTAGE_H

#include <stdint.h>
#include "../host.h"
#include "../macros.h"
#include "../plugin.h"
#include "../status.h"
#include "../tensor.h"

RL_EXTERN_C_BEGIN

#define RL_IFACE_ADVANTAGE "rl.advantage/1"

typedef struct rl_advantage_inputs {
    uint32_t struct_size;
    uint32_t reserved0;          /* 0 */
    rl_tensor_view_t rewards;    /* float32/64 [n_seqs]: one reward per sequence */
    rl_tensor_view_t group_ids;  /* int64 [n_seqs]: samples of one prompt share an id */
    rl_tensor_view_t cu_seqlens; /* int64 [n_seqs + 1]: token offsets */
    /* Optional per-token tensors, [n_tokens] each: "loss_mask" (1 on completion
     * tokens; all ones when absent), "token_rewards", "values", "advantages"
     * (given advantages, for normalizing estimators), "old_logprobs" and
     * "ref_logprobs" (KL-penalised rewards). Per-sequence inputs travel as
     * per-token tensors holding the sequence's value on its tokens:
     * "reward_baselines", "truncated", "num_turns". Borrowed. */
    rl_tensor_list_t tensors;
} rl_advantage_inputs_t;

typedef struct rl_advantage_iface {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */

    /* [worker] Compute and emit the outputs listed above; metrics through
     * emit_metric. One call at a time per instance. */
    rl_status_t(RL_ABI *compute)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                                 const rl_advantage_inputs_t *inputs);
} rl_advantage_iface_t;

RL_EXTERN_C_END

#endif /* RL_KINDS_ADVANTAGE_H */
