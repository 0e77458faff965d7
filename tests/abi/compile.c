/* Compiled as C11 and C17 with -Wall -Wextra -Wpedantic -Wpadded -Werror: the
 * umbrella header is pure C, has no implicit padding, and its INIT macros
 * compile. */
#include <rl_api.h>

_Static_assert(RL_ABI_VERSION == RL_MAKE_VERSION(RL_ABI_VERSION_MAJOR, RL_ABI_VERSION_MINOR,
                                                 RL_ABI_VERSION_PATCH),
               "RL_ABI_VERSION packs its parts");
_Static_assert(RL_ABI_COMPATIBLE(RL_MAKE_VERSION(0, 2, 0), RL_MAKE_VERSION(0, 1, 5)),
               "an older minor loads under major 0");
_Static_assert(!RL_ABI_COMPATIBLE(RL_MAKE_VERSION(0, 1, 0), RL_MAKE_VERSION(0, 2, 0)),
               "a newer minor does not load under major 0");
_Static_assert(!RL_ABI_COMPATIBLE(RL_MAKE_VERSION(1, 0, 0), RL_MAKE_VERSION(0, 1, 0)),
               "different majors do not load");
_Static_assert(RL_ABI_COMPATIBLE(RL_MAKE_VERSION(1, 3, 0), RL_MAKE_VERSION(1, 0, 0)),
               "from major 1 any older minor loads");

int rl_abi_compile_c_check(void);
int rl_abi_compile_c_check(void) {
    rl_plugin_create_desc_t cd = RL_PLUGIN_CREATE_DESC_INIT;
    rl_runtime_desc_t rd = RL_RUNTIME_DESC_INIT;
    return (int)(cd.struct_size + rd.struct_size);
}
