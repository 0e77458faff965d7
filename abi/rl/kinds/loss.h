/* abi/rl/kinds/loss.h: the loss contract.
 *
 * Inputs are named per-token tensors over one packed batch: every per-token
 * tensor has shape [n_tokens]; `cu_seqlens` (int64, [n_seqs + 1], starting at 0
 * and ending at n_tokens) marks where each sequence starts. Float inputs are
 * float32 or float64; "labels" is int64; "loss_mask" is float, int or bool.
 * The plugin returns the loss value and d loss / d input for each
 * differentiable input it was handed buffers for, and emits metrics through
 * ctx->host->emit_metric and extra per-token outputs through emit_tensor. The
 * trainer owns autograd: it wraps one compute() in one autograd node.
 *
 * Standard input names: logprobs, old_logprobs, rollout_logprobs,
 * prox_logprobs, ref_logprobs, teacher_logprobs, advantages, loss_mask,
 * labels, entropy, values, old_values, returns; per-token weights: weights
 * (every loss: scales each token's loss), rollout_is_weights (policy losses:
 * precomputed importance weights of the policy term), rl_weights, ce_weights,
 * ref_kl_weights (loss components, docs/losses.md). */
#ifndef RL_KINDS_LOSS_H
#define RL_KINDS_LOSS_H

#include <stdint.h>
#include "../host.h"
#include "../macros.h"
#include "../plugin.h"
#include "../status.h"
#include "../tensor.h"

RL_EXTERN_C_BEGIN

#define RL_IFACE_LOSS "rl.loss/1"

/* Which inputs the loss reads. NULL-terminated lists of names, owned by the
 * plugin, valid until destroy(). They may depend on the instance's parameters
 * (use_tis adds rollout_logprobs to `required`).
 * [owned by plugin until destroy(): required, optional, differentiable] */
typedef struct rl_loss_signature {
    uint32_t struct_size;
    uint32_t reserved0;                /* 0 */
    const char *const *required;       /* must be present */
    const char *const *optional;       /* read when present */
    const char *const *differentiable; /* inputs the loss has gradients for */
} rl_loss_signature_t;

typedef struct rl_loss_inputs {
    uint32_t struct_size;
    uint32_t reserved0;          /* 0 */
    rl_tensor_list_t tensors;    /* named per-token inputs; borrowed */
    rl_tensor_view_t cu_seqlens; /* int64 [n_seqs + 1]; borrowed */
    /* Normalizers for losses split over several calls (gradient accumulation):
     * the number of loss tokens and of sequences in the whole optimizer step.
     * 0 means "this call's own count". */
    double global_tokens;
    double global_seqs;
} rl_loss_inputs_t;

typedef struct rl_loss_outputs {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */
    double loss;        /* written by the plugin */
    /* Gradient buffers, allocated and zero-filled by the host: one per
     * differentiable input present in the call, with that input's name, shape
     * and dtype. The plugin writes d loss / d input into them. count is 0 when
     * the caller wants no gradients (forward only). */
    rl_tensor_list_t grads;
} rl_loss_outputs_t;

typedef struct rl_loss_iface {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */

    /* [thread-safe] Fill *out (the host set out->struct_size) with lists the
     * plugin keeps. [owned by plugin until destroy(): out] */
    rl_status_t(RL_ABI *get_signature)(const rl_plugin_t *plugin, rl_loss_signature_t *out);

    /* [worker] One loss evaluation; one call at a time per instance. Missing
     * required inputs, wrong shapes and NaN/Inf inputs are refused with a
     * message naming the input. */
    rl_status_t(RL_ABI *compute)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                                 const rl_loss_inputs_t *inputs, rl_loss_outputs_t *outputs);
} rl_loss_iface_t;

RL_EXTERN_C_END

#endif /* RL_KINDS_LOSS_H */
