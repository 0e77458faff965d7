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
 * (micro-batches) and over the ranks of a distributed run (plugin ABI 0.6;
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
 * text, the failure message) are attached to this context.
 * [owned by host until deinit(): host] [borrowed: stream, abort_flag, host_data] */
typedef struct rl_call_ctx {
    uint32_t struct_size;
    uint32_t reserved0;                 /* 0 */
    const struct rl_host_api *host;     /* the host that made the call */
    void *stream;                       /* cudaStream_t for CUDA tensors, else NULL */
    const volatile int32_t *abort_flag; /* non-zero: return RL_ERR_ABORTED soon; may be NULL */
    void *host_data;                    /* reserved for the host */
} rl_call_ctx_t;

/* The host services table (SQLite's sqlite3_api_routines + CLAP's clap_host).
 * Owned by the host; valid from the plugin entry's init() until its deinit().
 * Append-only: check RL_HAS_FIELD(host, rl_host_api_t, slot) before using a slot
 * newer than the ABI version you target. [owned by host until deinit(): host_data]
 * [static: name, version] */
typedef struct rl_host_api {
    uint32_t struct_size;
    uint32_t abi_version; /* RL_PLUGIN_ABI_VERSION the host was built with */
    void *host_data;      /* reserved for the host */
    const char *name;     /* host name, e.g. "rl-runtime" */
    const char *version;  /* host version, e.g. "0.1.0" */

    /* [thread-safe] Host extension by revisioned id (the RL_EXT_HOST_* ids
     * listed below, one header each under rl/ext/); NULL for an id the host does
     * not know. [owned by host until deinit()] */
    const void *(RL_ABI *get_extension)(const struct rl_host_api *host, const char *id);

    /* [thread-safe] Log a NUL-terminated UTF-8 message. The host copies it. */
    void(RL_ABI *log)(const struct rl_host_api *host, rl_log_level_t level, const char *msg);

    /* [thread-safe] Attach a message to the failing call and return `status`, so a
     * plugin writes `return ctx->host->fail(ctx, RL_ERR_INVALID_ARG, "...");`.
     * The host copies msg and names the plugin in what it reports. */
    rl_status_t(RL_ABI *fail)(const rl_call_ctx_t *ctx, rl_status_t status, const char *msg);

    /* [thread-safe] Host allocator. Memory the host frees comes from here; memory
     * from here is freed here (mem_free(NULL) is a no-op). align is a power of two
     * (0 means the default, 16). Returns NULL when out of memory, when align is
     * not a power of two, or when size cannot be rounded up to align.
     * [owned by caller until mem_free] */
    void *(RL_ABI *mem_alloc)(const struct rl_host_api *host, size_t size, size_t align);
    /* [thread-safe] Frees what mem_alloc returned; NULL is a no-op. [released: ptr] */
    void(RL_ABI *mem_free)(const struct rl_host_api *host, void *ptr);

    /* [call-thread] Outputs of the call in `ctx`. The host copies what it is
     * given, so the arguments stay borrowed. Emitting the same name twice in one
     * call is RL_ERR_INVALID_ARG. Valid only during a call that has an output
     * sink (every kind call does); elsewhere they return RL_ERR_BAD_STATE. */

    /* [call-thread] A named scalar metric ("pg_clipfrac"). NaN and Inf are accepted and
     * reported as such. */
    rl_status_t(RL_ABI *emit_metric)(const rl_call_ctx_t *ctx, const char *name, double value);
    /* [call-thread] A named tensor (any dtype the host can hold, CPU or the call's device). */
    rl_status_t(RL_ABI *emit_tensor)(const rl_call_ctx_t *ctx, const char *name,
                                     const rl_tensor_view_t *view);
    /* [call-thread] A named UTF-8 text (JSON for structured results). */
    rl_status_t(RL_ABI *emit_text)(const rl_call_ctx_t *ctx, const char *name,
                                   rl_string_view_t text);

    /* ---- slots added in later minors go below, never above ---- */

    /* (plugin ABI 0.6) [call-thread] A named scalar metric with the reduction the host
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
 * Each extension has its header under rl/ext/ (included below). Headers under
 * rl/ext/draft/ are previews: not covered by the plugin ABI version, they may
 * change or vanish in any minor.
 *
 * Every plugin ABI 0.2 host (librl):
 *   RL_EXT_HOST_THREAD_CHECK  rl_host_thread_check_t  rl/ext/thread_check.h
 * Every plugin ABI 0.5 host (librl):
 *   RL_EXT_HOST_COLLECTIVE    rl_host_collective_t    rl/ext/collective.h */

RL_EXTERN_C_END

/* The extension structs (rl/ext/, one header each). */
#include "ext/collective.h"
#include "ext/thread_check.h"

#endif /* RL_HOST_H */
