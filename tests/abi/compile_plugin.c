/* The plugin ABI stands alone: rl_plugin.h compiles by itself as strict C11
 * and brings none of librl's functions (docs/abi.md, "Two contracts"). */
#include <rl_plugin.h>

#if defined(RL_API_H) || defined(RL_RUNTIME_H) || defined(RL_TRAIN_H) || defined(RL_STEP_H)
#error "rl_plugin.h pulls in an embedder header"
#endif

_Static_assert(RL_ABI_VERSION == RL_PLUGIN_ABI_VERSION, "RL_ABI_VERSION names the plugin ABI");
_Static_assert(sizeof(rl_host_collective_t) > 0 && sizeof(rl_host_thread_check_t) > 0,
               "the host extensions reach plugins through rl/host.h");

int rl_abi_compile_plugin_only(void);
int rl_abi_compile_plugin_only(void) {
    return (int)RL_VERSION_MINOR(RL_PLUGIN_ABI_VERSION);
}
