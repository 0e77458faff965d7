/* abi/rl/disagg.h: the disaggregated mode's three-role protocol
 * (docs/disaggregated.md): rollout workers -> orchestrator -> trainer, over the
 * transport plugins (zmq or filesystem).
 *
 *   worker end        hello (again until the first credit), a credit for each
 *                     chunk, the chunk of scored rollouts numbered (worker_run, seq)
 *   orchestrator      the whole loop in one call: it owns the buffer, the
 *                     advantages, the batches (kept until the trainer's checkpoint
 *                     covers them), the credits, its saved state and its resume
 *   trainer end       the batch of each step in order, acknowledgements, the
 *                     orchestrator's hello and the workers' weight requests
 *
 * The model work (sampling, scoring, training, sending weights) stays with the
 * caller; these objects move the messages and keep the protocol's promises:
 * a chunk is taken once (a repeated (worker_run, seq) is skipped, a gap is
 * counted lost), every step is trained once and in order, and a peer silent
 * past the timeout is an error naming it. Every message carries
 * "protocol": RL_DISAGG_PROTOCOL_VERSION; one of another version is refused
 * naming both versions and the peer.
 *
 * config_json (all three): {"transport": "zmq" | "filesystem", "dir": the
 * shared folder (filesystem; also where the orchestrator keeps its state),
 * "host", "port" (zmq: the trainer binds port, the orchestrator port + 1,
 * worker K port + 2 + K), "hwm" (default 64), "timeout" (seconds, default 120),
 * "timeout_name" (how errors name the timeout; default "timeout"), "workers"
 * (rollout workers, default 1), "steps" (the trainer's last version),
 * "checkpoint_every" (the trainer's checkpoints, 0: only at the end)}; the
 * orchestrator adds "max_async_level" (default 1), "min_rollouts" (rollouts per
 * batch, default 1), "resume" (take back the state saved in
 * <dir>/orchestrator, default false) and "state_dir" (default <dir>/orchestrator).
 *
 * Same conventions as runtime.h: status returns with rl_last_error(), opaque
 * handles, JSON options, rl_result_t outputs. Every object is used from one
 * thread. Embedder API 0.11 (plugins see nothing of it). */
#ifndef RL_DISAGG_H
#define RL_DISAGG_H

#include <stdint.h>
#include "macros.h"
#include "runtime.h"
#include "status.h"
#include "step.h"
#include "train.h"

RL_EXTERN_C_BEGIN

/* The version every message of the protocol carries ("protocol" in its header). */
#define RL_DISAGG_PROTOCOL_VERSION 1

typedef struct rl_disagg_worker rl_disagg_worker_t;
typedef struct rl_disagg_trainer rl_disagg_trainer_t;

/* [thread-safe] (since 0.11) The protocol version librl speaks (RL_DISAGG_PROTOCOL_VERSION
 * of its build). */
RL_API uint32_t rl_disagg_protocol_version(void);

/* [control-thread] (since 0.11) Worker `worker` (0 .. workers - 1) of the protocol: its
 * channels over `runtime`'s transport plugins (kept: it must outlive the
 * worker) and a new worker_run naming this process. Nothing is sent yet.
 * [kept until rl_disagg_worker_destroy: runtime] */
RL_API rl_status_t rl_disagg_worker_create(rl_runtime_t *runtime, const char *config_json,
                                           int64_t worker, rl_disagg_worker_t **out_worker);
/* [control-thread] (since 0.11) NULL is a no-op. */
RL_API void rl_disagg_worker_destroy(rl_disagg_worker_t *worker);

/* [control-thread] (since 0.11) Says hello to the orchestrator (a new worker process; the
 * trainer is asked to send it the weights in use again). A failing send is
 * retried for 5 s. */
RL_API rl_status_t rl_disagg_worker_hello(rl_disagg_worker_t *worker);

/* [control-thread] (since 0.11) Waits for a credit for the next chunk (or the end). Before
 * the first credit it says hello again every 2 s. Scalars "seq" (the number of
 * the next chunk), "min_version" (sample with weights at least this new),
 * "done" (1: the run is over, send nothing more), "trainer_restarted" (1: the
 * trainer restarted since the last credit; take its weights of
 * "trainer_version", older ones), "trainer_version" (the trainer's version as
 * the orchestrator last heard it; after a restart the version it restarted at); text "worker_run".
 * RL_ERR_TIMEOUT naming the orchestrator when no credit comes within the
 * timeout. */
RL_API rl_status_t rl_disagg_worker_credit(rl_disagg_worker_t *worker, rl_result_t **out_result);

/* [control-thread] (since 0.11) Sends the next chunk (numbered "seq" of the last credit):
 * every scored rollout of `rollouts` (borrowed for the call), sampled with
 * weights of `policy_version`. */
RL_API rl_status_t rl_disagg_worker_send(rl_disagg_worker_t *worker, const rl_rollouts_t *rollouts,
                                         int64_t policy_version);

/* [control-thread] (since 0.11) Runs the orchestrator until the trainer says it is done
 * (then every worker gets a last credit saying so). `buffer` (its difficulty
 * filter and staleness; empty, or it is refilled from the saved state) and
 * `advantage` (an instance of kind "advantage") are borrowed for the call.
 * Its state is saved in state_dir after every change and taken back with
 * "resume". It prints one line per event on stdout ("[orchestrator] ...").
 * Result scalars "chunks", "batches", "duplicates", "lost_chunks",
 * "worker_restarts", "trainer_restarts", "resent", "orchestrator_restarts".
 * RL_ERR_TIMEOUT when neither the trainer nor a worker says anything within
 * the timeout. */
RL_API rl_status_t rl_disagg_orchestrator_run(rl_runtime_t *runtime, const char *config_json,
                                              rl_buffer_t *buffer, rl_instance_t *advantage,
                                              rl_result_t **out_result);

/* [control-thread] (since 0.11) The trainer's end: its channels over `runtime`'s transport
 * plugins (kept: it must outlive the trainer end) and a new trainer_run
 * naming this process. With the filesystem transport, batches left in the
 * shared folder by an earlier trainer are removed.
 * [kept until rl_disagg_trainer_destroy: runtime] */
RL_API rl_status_t rl_disagg_trainer_create(rl_runtime_t *runtime, const char *config_json,
                                            rl_disagg_trainer_t **out_trainer);
/* [control-thread] (since 0.11) NULL is a no-op. */
RL_API void rl_disagg_trainer_destroy(rl_disagg_trainer_t *trainer);

/* [control-thread] (since 0.11) Says hello to the orchestrator at `version` (the trainer's
 * policy version: 0, or its checkpoint's when it resumed); the orchestrator
 * sends the batches from that step on. */
RL_API rl_status_t rl_disagg_trainer_hello(rl_disagg_trainer_t *trainer, int64_t version);

/* [control-thread] (since 0.11) The next message for the trainer at `version`: the batch of
 * step `version` (a batch of a past step is skipped and counted, one of a later
 * step kept until its turn), or a worker's request for the weights in use.
 * Text "header" (JSON: "kind" "rl.batch" with "step" and the orchestrator's
 * counters, or "rl.weights_wanted" with "worker"; both with
 * "duplicate_batches", the skipped batches so far), the batch's tensors
 * (input_ids, cu_seqlens and the per-token ones: the trainer's input). An
 * orchestrator's hello is answered here (it learns the version). RL_ERR_TIMEOUT
 * naming the orchestrator when no batch comes within the timeout. */
RL_API rl_status_t rl_disagg_trainer_next(rl_disagg_trainer_t *trainer, int64_t version,
                                          rl_result_t **out_result);

/* [control-thread] (since 0.11) Acknowledges the step that made `version`: the orchestrator
 * learns the version, the checkpoint that surely covers it (checkpoint_every)
 * and whether the run is done (version >= steps). */
RL_API rl_status_t rl_disagg_trainer_ack(rl_disagg_trainer_t *trainer, int64_t version);

RL_EXTERN_C_END

#endif /* RL_DISAGG_H */
