/* abi/rl/version.h: the ABI version, one packed uint32_t. */
#ifndef RL_VERSION_H
#define RL_VERSION_H

#include <stdint.h>

/* 10 bits major, 10 bits minor, 12 bits patch (Vulkan-style packing). */
#define RL_MAKE_VERSION(major, minor, patch)                                                       \
    ((((uint32_t)(major)) << 22) | (((uint32_t)(minor)) << 12) | ((uint32_t)(patch)))
#define RL_VERSION_MAJOR(v) (((uint32_t)(v) >> 22) & 0x3FFu)
#define RL_VERSION_MINOR(v) (((uint32_t)(v) >> 12) & 0x3FFu)
#define RL_VERSION_PATCH(v) ((uint32_t)(v)&0xFFFu)

/* Major 0: the ABI is young. The loader requires equal majors, and while the
 * major is 0 it also refuses a plugin built for a newer minor than the host.
 * Minors are additive: structs only grow at the end (see struct_size), new
 * interfaces come as new revisioned ids.
 *
 * History (docs/abi.md keeps the full list):
 *   0.1  first published layout; every struct's minimum accepted size.
 *   0.2  rl_plugin_t.get_params (optional slot); host extension
 *        RL_EXT_HOST_THREAD_CHECK; rl_instance_params().
 *   0.3  rl_batch_t.flags / sampling_temperature (trainer scores at the
 *        sampling temperature); rl_tokenizer_load, rl_tokenizer_decode_v2,
 *        rl_tokenizer_encode_chat, RL_ENCODE_PLAIN_TEXT, RL_DECODE_SKIP_SPECIAL.
 *   0.4  functions only: rl_transport_send / recv and rl_weights_send / recv
 *        (transports), rl_server_* (serve.h), rl_inference_client_*
 *        (inference.h).
 *   0.5  LoRA: rl_adapter_create / load / save / export_merged / remove /
 *        info; "adapter" / "lora" keys of rl_trainer_create, "adapter" of
 *        rl_engine_generate params and the engine config. Host extension
 *        RL_EXT_HOST_COLLECTIVE (rl_host_collective_t: a TCPStore rendezvous
 *        and Gloo / NCCL broadcast for plugins); rl_weights_recv option
 *        "newer_than"; rl_model_load options "value_head"
 *        and "value_head_seed" (a PPO critic head on the policy's trunk; the
 *        trainer computes the loss input "values" and rl_trainer_forward
 *        returns it), rl_model_info "value_head"; rl_training_server_*
 *        (training_server.h: the Tinker-compatible training server).
 *   0.6  rl_host_api_t.emit_metric_reduced and rl_metric_reduction_t: metrics
 *        with a declared reduction (token / sequence mean with its weight,
 *        sum, min, max) over micro-batches and ranks.
 *   0.7  functions only: rl_buffer_save / rl_buffer_load (a restarted process
 *        takes back what its rollout buffer held).
 *   0.8  functions only: rl_rollouts_set_rewards (rewards from outside an env
 *        plugin: reward models, judges, shaping such as DAPO's overlong
 *        penalty).
 *   0.9  functions only: rl_env_step, rl_rollouts_generate_episodes (multi-turn
 *        episodes), rl_train_batch_supervised_episodes; the env step result's
 *        "observation" and "role".
 *   0.10 functions only: reward models. rl_model_load reads
 *        ...ForSequenceClassification folders (Llama, Qwen2, Qwen3);
 *        rl_model_info "task" and "num_labels"; rl_trainer_forward of such a
 *        model returns tensor "scores" and scalar "num_labels";
 *        rl_model_init_preset "tiny-reward"; rl_rollouts_generate_episodes
 *        option "turn_rewards" (per-turn token rewards for the estimator). */
#define RL_ABI_VERSION_MAJOR 0
#define RL_ABI_VERSION_MINOR 10
#define RL_ABI_VERSION_PATCH 0
#define RL_ABI_VERSION                                                                             \
    RL_MAKE_VERSION(RL_ABI_VERSION_MAJOR, RL_ABI_VERSION_MINOR, RL_ABI_VERSION_PATCH)

/* True when a plugin built for `plugin_version` may be loaded by a host built
 * for `host_version`. The one compatibility rule, used by the loader and
 * available to plugins that want to check host->abi_version themselves. */
#define RL_ABI_COMPATIBLE(host_version, plugin_version)                                            \
    (RL_VERSION_MAJOR(host_version) == RL_VERSION_MAJOR(plugin_version) &&                         \
     (RL_VERSION_MAJOR(host_version) != 0 ||                                                       \
      RL_VERSION_MINOR(plugin_version) <= RL_VERSION_MINOR(host_version)))

#endif /* RL_VERSION_H */
