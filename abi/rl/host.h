/* abi/rl/host.h: the services the host hands to every plugin, and the per-call
 * context. A plugin reaches the host only through these two structs. */
#ifndef RL_HOST_H
#define RL_HOST_H

#include <stddef.h>
#include <stdint.h>
#include "macros.h"
#include "status.h"
#include "tensor.h"
#include "types.h"

RL_EXTERN_C_BEGIN

/* Log levels for rl_host_api_t.log. */
typedef int32_t rl_log_level_t;
enum { RL_LOG_TRACE = 0, RL_LOG_DEBUG = 1, RL_LOG_INFO = 2, RL_LOG_WARN = 3, RL_LOG_ERROR = 4 };

/* How the host combines the values of one metric over the calls of one step
 * (micro-batches) and over the ranks of a distributed run (ABI 0.6;
 * rl_host_api_t.emit_metric_reduced). `weight` is the number of elements the
 * value was computed over (tokens for TOKEN_MEAN, sequences for SEQ_MEAN, the
 * elements of the min / max): the means are sum(weight * value) / sum(weight);
 * MIN / MAX take the extreme over the values with weight > 0; SUM adds the
 * values (weight unused). A value of weight 0 (the call saw no element) counts
 * only when every value has weight 0: the result is then their plain mean. */
typedef int32_t rl_metric_reduction_t;
enum {
    RL_METRIC_DEFAULT = 0,    /* the host's choice, as emit_metric: for a loss, the mean
                                 weighted by the call's loss tokens (weight unused) */
    RL_METRIC_TOKEN_MEAN = 1, /* mean over tokens; weight: the tokens it averages */
    RL_METRIC_SEQ_MEAN = 2,   /* mean over sequences; weight: the sequences it averages */
    RL_METRIC_SUM = 3,        /* sum (counts, totals) */
    RL_METRIC_MIN = 4,        /* minimum; weight: the elements it is the minimum of */
    RL_METRIC_MAX = 5         /* maximum; weight: the elements it is the maximum of */
};

/* Everything scoped to one call into a plugin. Borrowed: valid until that call
 * returns. Outputs that the call emits through the host (metrics, tensors,
 * text, the failure message) are attached to this context. */
typedef struct rl_call_ctx {
    uint32_t struct_size;
    uint32_t reserved0;                 /* 0 */
    const struct rl_host_api *host;     /* the host that made the call; borrowed */
    void *stream;                       /* cudaStream_t for CUDA tensors, else NULL; borrowed */
    const volatile int32_t *abort_flag; /* non-zero: return RL_ERR_ABORTED soon; may be NULL */
    void *host_data;                    /* reserved for the host */
} rl_call_ctx_t;

/* The host services table (SQLite's sqlite3_api_routines + CLAP's clap_host).
 * Owned by the host; valid from the plugin entry's init() until its deinit().
 * Append-only: check RL_HAS_FIELD(host, rl_host_api_t, slot) before using a slot
 * newer than the ABI version you target. */
typedef struct rl_host_api {
    uint32_t struct_size;
    uint32_t abi_version; /* RL_ABI_VERSION the host was built with */
    void *host_data;      /* reserved for the host */
    const char *name;     /* host name, e.g. "rlhost"; static */
    const char *version;  /* host version, e.g. "0.1.0"; static */

    /* [thread-safe] Host extension by revisioned id (the RL_EXT_HOST_* ids
     * below); NULL for an id the host does not know. Owned by the host, valid
     * until the plugin entry's deinit(). */
    const void *(RL_ABI *get_extension)(const struct rl_host_api *host, const char *id);

    /* [thread-safe] Log a NUL-terminated UTF-8 message. The host copies it. */
    void(RL_ABI *log)(const struct rl_host_api *host, rl_log_level_t level, const char *msg);

    /* [thread-safe] Attach a message to the failing call and return `status`, so a
     * plugin writes `return ctx->host->fail(ctx, RL_ERR_INVALID_ARG, "...");`.
     * The host copies msg and names the plugin in what it reports. */
    rl_status_t(RL_ABI *fail)(const rl_call_ctx_t *ctx, rl_status_t status, const char *msg);

    /* [thread-safe] Host allocator. Memory the host frees comes from here; memory
     * from here is freed here (mem_free(NULL) is a no-op). align is a power of two
     * (0 means the default, 16). Returns NULL when out of memory. */
    void *(RL_ABI *mem_alloc)(const struct rl_host_api *host, size_t size, size_t align);
    void(RL_ABI *mem_free)(const struct rl_host_api *host, void *ptr);

    /* [call-thread] Outputs of the call in `ctx`. The host copies what it is
     * given, so the arguments stay borrowed. Emitting the same name twice in one
     * call is RL_ERR_INVALID_ARG. Valid only during a call that has an output
     * sink (every kind call does); elsewhere they return RL_ERR_BAD_STATE. */

    /* A named scalar metric ("pg_clipfrac"). NaN and Inf are accepted and
     * reported as such. */
    rl_status_t(RL_ABI *emit_metric)(const rl_call_ctx_t *ctx, const char *name, double value);
    /* A named tensor (any dtype the host can hold, CPU or the call's device). */
    rl_status_t(RL_ABI *emit_tensor)(const rl_call_ctx_t *ctx, const char *name,
                                     const rl_tensor_view_t *view);
    /* A named UTF-8 text (JSON for structured results). */
    rl_status_t(RL_ABI *emit_text)(const rl_call_ctx_t *ctx, const char *name,
                                   rl_string_view_t text);

    /* ---- slots added in later minors go below, never above ---- */

    /* (ABI 0.6) [call-thread] A named scalar metric with the reduction the host
     * applies over the calls of a step and over ranks (rl_metric_reduction_t;
     * weight finite and >= 0). Same rules as emit_metric otherwise; an unknown
     * reduction or a bad weight is RL_ERR_INVALID_ARG. Check
     * RL_HAS_FIELD(host, rl_host_api_t, emit_metric_reduced) first: an older
     * host has only emit_metric. */
    rl_status_t(RL_ABI *emit_metric_reduced)(const rl_call_ctx_t *ctx, const char *name,
                                             double value, rl_metric_reduction_t reduction,
                                             double weight);
} rl_host_api_t;

/* ---- host extensions ------------------------------------------------------
 * What host->get_extension(host, id) answers. An extension struct starts with
 * struct_size and grows at its end like every other; a changed meaning gets a
 * new revision ("/2"). The host of librl provides every extension listed here.
 *
 * Every ABI 0.2 host (librl):
 *   RL_EXT_HOST_THREAD_CHECK  rl_host_thread_check_t
 * Every ABI 0.5 host (librl):
 *   RL_EXT_HOST_COLLECTIVE    rl_host_collective_t */

/* "rl.host.thread-check/1" (ABI 0.2): lets a plugin assert the thread
 * annotations of this header (CLAP's thread-check). */
#define RL_EXT_HOST_THREAD_CHECK "rl.host.thread-check/1"
typedef struct rl_host_thread_check {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */
    /* [thread-safe] 1 when called on the host's [control-thread] (the thread
     * that created the runtime), else 0. */
    uint32_t(RL_ABI *is_control_thread)(const struct rl_host_api *host);
} rl_host_thread_check_t;

/* "rl.host.collective/1" (ABI 0.5): the host's collectives, so a plugin can
 * move tensors over a process group without linking a collective library
 * (libtorch's c10d in librl: a TCPStore rendezvous, Gloo for CPU tensors,
 * NCCL for CUDA tensors). A store is a key -> integer table at host:port,
 * hosted by one process (is_server) and reached by the others; a group is
 * world_size ranks that met through a store under a key prefix. Every call
 * is [thread-safe] for distinct objects; one object is used by one thread at
 * a time. A failed call returns its status and leaves a message for
 * last_error() on the calling thread. */
#define RL_EXT_HOST_COLLECTIVE "rl.host.collective/1"
typedef struct rl_collective_store rl_collective_store_t; /* opaque, owned by the host */
typedef struct rl_collective_group rl_collective_group_t; /* opaque, owned by the host */

typedef struct rl_host_collective {
    uint32_t struct_size;
    uint32_t reserved0; /* 0 */

    /* Host (is_server 1) or reach (0) the store at host:port, waiting at
     * most timeout_ms for it. RL_ERR_IO when it cannot. Freed by store_close. */
    rl_status_t(RL_ABI *store_open)(const struct rl_host_api *host, const char *address,
                                    int32_t port, int32_t is_server, int64_t timeout_ms,
                                    rl_collective_store_t **out_store);
    void(RL_ABI *store_close)(rl_collective_store_t *store); /* NULL: no-op */

    /* Adds delta to the integer at key (a new key starts at 0) and returns the
     * sum in *out_value; delta 0 reads. RL_ERR_IO when the store is gone. */
    rl_status_t(RL_ABI *store_add)(rl_collective_store_t *store, const char *key, int64_t delta,
                                   int64_t *out_value);

    /* Join the group `prefix` of world_size ranks on `store` as `rank`,
     * waiting at most timeout_ms for every rank. backend: "gloo" or "nccl";
     * device_index: the CUDA device under nccl (ignored under gloo). Every
     * later collective of the group waits at most timeout_ms. Freed by
     * group_leave (which closes its connections). */
    rl_status_t(RL_ABI *group_join)(rl_collective_store_t *store, const char *prefix,
                                    const char *backend, int32_t rank, int32_t world_size,
                                    int32_t device_index, int64_t timeout_ms,
                                    rl_collective_group_t **out_group);
    void(RL_ABI *group_leave)(rl_collective_group_t *group); /* NULL: no-op */

    /* Broadcast `tensors` in place from rank `root`, in order: root's views
     * are read, the others' are written (same dtypes and shapes on every
     * rank; contiguous). CPU or CUDA views under either backend: the host
     * stages them through the backend's device when they are elsewhere.
     * RL_ERR_TIMEOUT or RL_ERR_IO when a rank is gone; the group is then
     * unusable (leave it and join a new one). */
    rl_status_t(RL_ABI *broadcast)(rl_collective_group_t *group, const rl_tensor_list_t *tensors,
                                   int32_t root);

    /* The message of this thread's last failed call; "" if none. Valid until
     * the thread's next call into this table. */
    const char *(RL_ABI *last_error)(void);
} rl_host_collective_t;

RL_EXTERN_C_END

#endif /* RL_HOST_H */
