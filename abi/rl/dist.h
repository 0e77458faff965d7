/* abi/rl/dist.h: the process group of a distributed run (docs/distributed.md).
 *
 * Ranks are started by `rlhost launch`, torchrun, a Slurm wrapper or a
 * Kubernetes operator with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 * MASTER_ADDR and MASTER_PORT set. The trainer joins the group when it is
 * created; rl_dist_init joins earlier with explicit settings. Without
 * WORLD_SIZE the process is a world of one and every call here is cheap.
 *
 * Every call below except rl_dist_info is a collective: all ranks make it, in
 * the same order. A rank that dies or stops answering makes the others fail
 * within dist.timeout with RL_ERR_IO and a message naming it. */
#ifndef RL_DIST_H
#define RL_DIST_H

#include <stdint.h>
#include "macros.h"
#include "status.h"
#include "train.h"
#include "types.h"

RL_EXTERN_C_BEGIN

/* [control-thread] (since 0.2) Joins the group of the environment. `config_json`: the "dist"
 * section
 * ({"timeout": seconds, "backend": "auto" | "gloo" | "nccl"}) or NULL for the
 * defaults; `device`: the model's device ("cpu", "cuda", "cuda:N"; NULL: cpu),
 * which picks NCCL or Gloo under "auto". Joining twice returns the same
 * group; different settings the second time are RL_ERR_BAD_STATE. The result
 * (optional) is as rl_dist_info's. */
RL_API rl_status_t rl_dist_init(const char *config_json, const char *device,
                                rl_result_t **out_result);

/* [control-thread] (since 0.2) Scalars "rank", "world_size", "local_rank", "local_world_size" and
 * text "backend" ("none" for a single process) of the group this process is in, joining it with the
 * defaults if it has not yet. */
RL_API rl_status_t rl_dist_info(rl_result_t **out_result);

/* [control-thread] (since 0.2) Waits for every rank. */
RL_API rl_status_t rl_dist_barrier(void);

/* [control-thread] (since 0.2) Text "value": rank `root`'s `value` (bytes) on every rank. */
RL_API rl_status_t rl_dist_broadcast(rl_string_view_t value, int32_t root,
                                     rl_result_t **out_result);

/* [control-thread] (since 0.2) Texts "0", "1", ...: every rank's `value`, by rank; scalar
 * "world_size". */
RL_API rl_status_t rl_dist_all_gather(rl_string_view_t value, rl_result_t **out_result);

RL_EXTERN_C_END

#endif /* RL_DIST_H */
