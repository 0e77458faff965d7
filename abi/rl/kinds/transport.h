/* abi/rl/kinds/transport.h: the transport contract.
 *
 * A message is a JSON header plus named tensors. Point-to-point transports
 * implement send/recv; collective transports (NCCL, Gloo) add broadcast for
 * weights. */
#ifndef RL_KINDS_TRANSPORT_H
#define RL_KINDS_TRANSPORT_H

#include <stdint.h>
#include "../host.h"
#include "../macros.h"
#include "../plugin.h"
#include "../status.h"
#include "../tensor.h"
#include "../types.h"

RL_EXTERN_C_BEGIN

#define RL_IFACE_TRANSPORT "rl.transport/1"

typedef struct rl_message_view {
    uint32_t struct_size;
    uint32_t reserved0;       /* 0 */
    rl_string_view_t header;  /* JSON object; borrowed */
    rl_tensor_list_t tensors; /* borrowed */
} rl_message_view_t;

typedef struct rl_transport_iface {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */

    /* [worker] Send one message. Returns once the message is handed over (it
     * may still be in flight); everything in `message` stays borrowed. */
    rl_status_t(RL_ABI *send)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                              const rl_message_view_t *message);

    /* [worker] Receive one message: emit text "header" and its tensors under
     * their names. Waits at most timeout_ms (negative: no limit, 0: poll);
     * RL_ERR_TIMEOUT when nothing arrived. */
    rl_status_t(RL_ABI *recv)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                              int64_t timeout_ms);

    /* [worker] Optional (NULL when not collective). Broadcast `tensors` in place
     * from rank `root` to every rank of the group. */
    rl_status_t(RL_ABI *broadcast)(const rl_plugin_t *plugin, const rl_call_ctx_t *ctx,
                                   const rl_tensor_list_t *tensors, int32_t root);
} rl_transport_iface_t;

RL_EXTERN_C_END

#endif /* RL_KINDS_TRANSPORT_H */
