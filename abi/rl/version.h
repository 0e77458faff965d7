/* abi/rl/version.h: the versions of the two contracts, each one packed uint32_t. */
#ifndef RL_VERSION_H
#define RL_VERSION_H

#include <stdint.h>

/* 10 bits major, 10 bits minor, 12 bits patch (Vulkan-style packing). */
#define RL_MAKE_VERSION(major, minor, patch)                                                       \
    ((((uint32_t)(major)) << 22) | (((uint32_t)(minor)) << 12) | ((uint32_t)(patch)))
#define RL_VERSION_MAJOR(v) (((uint32_t)(v) >> 22) & 0x3FFu)
#define RL_VERSION_MINOR(v) (((uint32_t)(v) >> 12) & 0x3FFu)
#define RL_VERSION_PATCH(v) ((uint32_t)(v)&0xFFFu)

/* Two contracts, two versions (docs/abi.md, "Two contracts"):
 *
 *   RL_PLUGIN_ABI_VERSION  what a plugin library sees: rl_plugin.h (entry,
 *                          plugin, host services, kinds, host extensions).
 *                          The only version the loader checks.
 *   RL_API_VERSION         the embedder API: librl's functions (the rest of
 *                          rl_api.h). Each function's comment says since which
 *                          version it exists ("since 0.4").
 *
 * Up to 0.10 one number (RL_ABI_VERSION) served both; from 0.10 on each moves
 * only when its own contract changes. Major 0: the contracts are young. The
 * loader requires equal plugin ABI majors, and while the major is 0 it also
 * refuses a plugin built for a newer minor than the host. Minors are
 * additive: structs only grow at the end (see struct_size), new interfaces
 * come as new revisioned ids, new functions appear. Headers under
 * rl/ext/draft/ are previews outside both versions.
 *
 * Plugin ABI history (docs/abi.md keeps the full list):
 *   0.1  first published layout; every struct's minimum accepted size.
 *   0.2  rl_plugin_t.get_params (optional slot); host extension
 *        RL_EXT_HOST_THREAD_CHECK.
 *   0.5  host extension RL_EXT_HOST_COLLECTIVE (rl_host_collective_t).
 *   0.6  rl_host_api_t.emit_metric_reduced and rl_metric_reduction_t.
 *   0.10 (0.3, 0.4 and 0.7 to 0.10 changed nothing a plugin sees: a plugin
 *        built for any of 0.6 to 0.10 has the same view of the host.)
 *
 * Embedder API history: 0.1 first functions; 0.2 rl_instance_params,
 * rl_dist_*; 0.3 rl_tokenizer_load / decode_v2 / encode_chat, rl_batch_t
 * flags; 0.4 transports and weights send / recv, rl_server_*,
 * rl_inference_client_*; 0.5 rl_adapter_*, value heads,
 * rl_training_server_*; 0.7 rl_buffer_save / load; 0.8
 * rl_rollouts_set_rewards; 0.9 episodes (rl_env_step, ...); 0.10 reward
 * models; 0.11 rl_get_api_version; 0.12 rl_buffer_push takes routing
 * tensors (routed_experts, routed_expert_weights). */
#define RL_PLUGIN_ABI_VERSION_MAJOR 0
#define RL_PLUGIN_ABI_VERSION_MINOR 10
#define RL_PLUGIN_ABI_VERSION_PATCH 0
#define RL_PLUGIN_ABI_VERSION                                                                      \
    RL_MAKE_VERSION(RL_PLUGIN_ABI_VERSION_MAJOR, RL_PLUGIN_ABI_VERSION_MINOR,                      \
                    RL_PLUGIN_ABI_VERSION_PATCH)

#define RL_API_VERSION_MAJOR 0
#define RL_API_VERSION_MINOR 12
#define RL_API_VERSION_PATCH 0
#define RL_API_VERSION                                                                             \
    RL_MAKE_VERSION(RL_API_VERSION_MAJOR, RL_API_VERSION_MINOR, RL_API_VERSION_PATCH)

/* The name RL_PLUGIN_ABI_VERSION had until 0.10; every plugin built so far
 * stores it in its entry and descriptors, so it stays. */
#define RL_ABI_VERSION_MAJOR RL_PLUGIN_ABI_VERSION_MAJOR
#define RL_ABI_VERSION_MINOR RL_PLUGIN_ABI_VERSION_MINOR
#define RL_ABI_VERSION_PATCH RL_PLUGIN_ABI_VERSION_PATCH
#define RL_ABI_VERSION RL_PLUGIN_ABI_VERSION

/* True when a plugin built for `plugin_version` may be loaded by a host built
 * for `host_version`. The one compatibility rule, used by the loader and
 * available to plugins that want to check host->abi_version themselves. */
#define RL_ABI_COMPATIBLE(host_version, plugin_version)                                            \
    (RL_VERSION_MAJOR(host_version) == RL_VERSION_MAJOR(plugin_version) &&                         \
     (RL_VERSION_MAJOR(host_version) != 0 ||                                                       \
      RL_VERSION_MINOR(plugin_version) <= RL_VERSION_MINOR(host_version)))

#endif /* RL_VERSION_H */
