/* abi/rl/ext/thread_check.h: the host extension "rl.host.thread-check/1"
 * (plugin ABI; rl/host.h includes it). */
#ifndef RL_EXT_THREAD_CHECK_H
#define RL_EXT_THREAD_CHECK_H

#include <stdint.h>
#include "../macros.h"

RL_EXTERN_C_BEGIN

struct rl_host_api;

/* "rl.host.thread-check/1" (plugin ABI 0.2): lets a plugin assert the thread
 * annotations of the headers (CLAP's thread-check). */
#define RL_EXT_HOST_THREAD_CHECK "rl.host.thread-check/1"
typedef struct rl_host_thread_check {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */
    /* [thread-safe] 1 when called on the host's [control-thread] (the thread
     * that created the runtime), else 0. */
    uint32_t(RL_ABI *is_control_thread)(const struct rl_host_api *host);
} rl_host_thread_check_t;

RL_EXTERN_C_END

#endif /* RL_EXT_THREAD_CHECK_H */
