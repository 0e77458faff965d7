/* abi/rl/ext/collective.h: the host extension "rl.host.collective/1"
 * (plugin ABI; rl/host.h includes it). */
#ifndef RL_EXT_COLLECTIVE_H
#define RL_EXT_COLLECTIVE_H

#include <stdint.h>
#include "../macros.h"
#include "../status.h"
#include "../tensor.h"

RL_EXTERN_C_BEGIN

struct rl_host_api;

/* "rl.host.collective/1" (plugin ABI 0.5): the host's collectives, so a plugin can
 * move tensors over a process group without linking a collective library
 * (libtorch's c10d in librl: a TCPStore rendezvous, Gloo for CPU tensors,
 * NCCL for CUDA tensors). A store is a key -> integer table at host:port,
 * hosted by one process (is_server) and reached by the others; a group is
 * world_size ranks that met through a store under a key prefix. Every call
 * is [thread-safe] for distinct objects; one object is used by one thread at
 * a time. A failed call returns its status and leaves a message for
 * last_error() on the calling thread. */
#define RL_EXT_HOST_COLLECTIVE "rl.host.collective/1"
typedef struct rl_collective_store rl_collective_store_t; /* opaque; see store_open */
typedef struct rl_collective_group rl_collective_group_t; /* opaque; see group_join */

typedef struct rl_host_collective {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */

    /* [thread-safe] Host (is_server 1) or reach (0) the store at host:port, waiting at
     * most timeout_ms for it. RL_ERR_IO when it cannot. Freed by store_close.
     * [owned by caller until store_close: out_store] */
    rl_status_t(RL_ABI *store_open)(const struct rl_host_api *host, const char *address,
                                    int32_t port, int32_t is_server, int64_t timeout_ms,
                                    rl_collective_store_t **out_store);
    /* [thread-safe] Closes a store this table opened; NULL is a no-op. [released: store] */
    void(RL_ABI *store_close)(rl_collective_store_t *store);

    /* [thread-safe] Adds delta to the integer at key (a new key starts at 0) and returns the
     * sum in *out_value; delta 0 reads. RL_ERR_IO when the store is gone. */
    rl_status_t(RL_ABI *store_add)(rl_collective_store_t *store, const char *key, int64_t delta,
                                   int64_t *out_value);

    /* [thread-safe] Join the group `prefix` of world_size ranks on `store` as `rank`,
     * waiting at most timeout_ms for every rank. backend: "gloo" or "nccl";
     * device_index: the CUDA device under nccl (ignored under gloo). Every
     * later collective of the group waits at most timeout_ms. Freed by
     * group_leave (which closes its connections). The group does not need
     * `store` afterwards: it may be closed first.
     * [owned by caller until group_leave: out_group] */
    rl_status_t(RL_ABI *group_join)(rl_collective_store_t *store, const char *prefix,
                                    const char *backend, int32_t rank, int32_t world_size,
                                    int32_t device_index, int64_t timeout_ms,
                                    rl_collective_group_t **out_group);
    /* [thread-safe] Leaves and frees a group this table joined; NULL is a no-op.
     * [released: group] */
    void(RL_ABI *group_leave)(rl_collective_group_t *group);

    /* [thread-safe] Broadcast `tensors` in place from rank `root`, in order: root's views
     * are read, the others' are written (same dtypes and shapes on every
     * rank; contiguous). CPU or CUDA views under either backend: the host
     * stages them through the backend's device when they are elsewhere.
     * RL_ERR_TIMEOUT or RL_ERR_IO when a rank is gone; the group is then
     * unusable (leave it and join a new one). `tensors` is borrowed for the
     * call. */
    rl_status_t(RL_ABI *broadcast)(rl_collective_group_t *group, const rl_tensor_list_t *tensors,
                                   int32_t root);

    /* [thread-safe] The message of this thread's last failed call; "" if none.
     * [owned by host until the thread's next call into this table] */
    const char *(RL_ABI *last_error)(void);
} rl_host_collective_t;

RL_EXTERN_C_END

#endif /* RL_EXT_COLLECTIVE_H */
