// Compiled as C++17 (inside the test) and C++20 with -Wpedantic -Wpadded -Werror.
#include <rl_api.h>

#if RL_ABI_VERSION_MAJOR != 0
#error "tests expect ABI major 0"
#endif

static_assert(RL_VERSION_MAJOR(RL_MAKE_VERSION(3, 2, 1)) == 3, "major");
static_assert(RL_VERSION_MINOR(RL_MAKE_VERSION(3, 2, 1)) == 2, "minor");
static_assert(RL_VERSION_PATCH(RL_MAKE_VERSION(3, 2, 1)) == 1, "patch");

int rl_abi_compile_cxx_check();
int rl_abi_compile_cxx_check() {
    rl_plugin_create_desc_t cd = RL_PLUGIN_CREATE_DESC_INIT;
    rl_runtime_desc_t rd = RL_RUNTIME_DESC_INIT;
    return static_cast<int>(cd.struct_size + rd.struct_size);
}
